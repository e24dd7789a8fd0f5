"""A collective's result lands at its wait(), never before: DeepSpeed's missing waits, shown every time.

gloo runs an async collective (async_op=True) on its own threads, and its work handles are
independent: DeepSpeed must wait on each handle before it reads that collective's output. A missing
wait is a race: the read sees the output before or after gloo writes it, depending on timing, so it
shows now and then (docs/findings.md, defect 9: 0.19.2's ZeRO-3 gather waited on its last handle
only, and one run in ten read a param that had not arrived). The worker (unless ZC_DS_DEFER=0)
issues every async collective into a private buffer of its own (the collective itself, its order
and its group unchanged) and copies the result into the caller's tensors when the caller waits on
the handle. A read that comes before its wait then sees the tensor as it was before the collective
(the local value of an all_reduce, the uninitialized output of an all_gather: NaN, since the worker
poisons uninitialized memory unless ZC_DS_POISON=0) in every run, and a handle never waited on never
delivers. Values that were right stay bit for bit the same: the collective is the same one, only
its result is copied later.

The patch point is the communication backend object, as comm_counter.py's (install this one first,
so that the counter counts the caller's call once). Synchronous calls go through private copies
too, delivered before they return (Note: gloo's threads never hold DeepSpeed's tensors).
What the private buffers allocate is the CPU backend's (memory.py: this file is a backend frame).
"""
import torch

# method -> (the name and position of the argument the collective writes, the position of async_op
# among the positional arguments, whether the written tensor(s) are also its input)
_DEFERRED = {
    "all_reduce": (("tensor", 0), 3, True),
    "all_reduce_coalesced": (("tensors", 0), 3, True),
    "broadcast": (("tensor", 0), 3, True),
    "reduce": (("tensor", 0), 4, True),
    "all_gather_into_tensor": (("output_tensor", 0), 3, False),
    "all_gather_base": (("output_tensor", 0), 3, False),
    "all_gather": (("tensor_list", 0), 3, False),
    "all_gather_coalesced": (("output_tensors", 0), 3, False),
    "reduce_scatter_tensor": (("output_tensor", 0), 4, False),
    "reduce_scatter": (("output", 0), 4, False),
    "all_to_all_single": (("output", 0), 5, False),
}


# The argument a non-in-place collective reads (position 1 in every one of them), by keyword.
_INPUT_NAMES = ("input_tensor", "tensor", "input_tensors", "input_list", "input")

# Note: gloo's threads never hold DeepSpeed's tensors. Every collective, synchronous ones too, reads
# and writes private copies, so the last reference to a DeepSpeed tensor is always DeepSpeed's own,
# dropped on the Python thread. The profiler sees only the allocations and frees of the threads it
# profiles: a DeepSpeed tensor whose last reference a gloo worker dropped after DeepSpeed let it go
# was freed where the profiler cannot see, and stayed live in the record until the scenario ended,
# in some runs and not others (an ipg buffer, a gradient; memory.py's "run to run" variation).
# The private copies are the CPU backend's (memory.py), kept apart from what is compared, and are
# reused for the life of a scenario (_Pool) rather than freed, for the same reason.


class DeferredWork:
    """A handle whose wait() waits on gloo's and then delivers the result into the caller's tensors."""

    def __init__(self, work, deliver):
        self._work = work
        self._deliver = deliver

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs) if self._work is not None else True
        if self._deliver is not None:
            deliver, self._deliver = self._deliver, None
            deliver()
        return out

    def is_completed(self):
        return self._deliver is None and (self._work is None or self._work.is_completed())

    def __getattr__(self, name):  # anything else a caller asks of gloo's handle
        return getattr(self._work, name)


class _Pool:
    """The private copies, kept and reused for the life of a scenario (Note: gloo's threads never hold
    DeepSpeed's tensors): a private copy is never freed while a scenario runs, so gloo's threads never
    free one where the profiler cannot see it."""

    def __init__(self):
        self.free = {}

    def clear(self):
        self.free = {}

    def take(self, t, copy_input):
        if isinstance(t, (list, tuple)):
            return [self.take(x, copy_input) for x in t]
        if not torch.is_tensor(t):
            return t
        free = self.free.get((tuple(t.shape), t.dtype), [])
        buf = free.pop() if free else torch.empty(t.shape, dtype=t.dtype)
        if copy_input:
            with torch.no_grad():
                buf.copy_(t)
        return buf

    def give(self, t):
        if isinstance(t, (list, tuple)):
            for x in t:
                self.give(x)
        elif torch.is_tensor(t):
            self.free.setdefault((tuple(t.shape), t.dtype), []).append(t)


def _copy_back(dst, src):
    if isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src):
            _copy_back(d, s)
    elif torch.is_tensor(dst):
        with torch.no_grad():
            dst.copy_(src)


class DeferredComm:
    def __init__(self):
        import deepspeed.comm.comm as comm_module
        self.pool = _Pool()
        self.backend = comm_module.cdb
        if self.backend is None:
            raise RuntimeError("deepspeed.comm has no backend: call init_distributed first")
        self.depth = 0
        self.deferred = 0  # async collectives whose result waited for their wait()
        for method, spec in _DEFERRED.items():
            if hasattr(self.backend, method):
                setattr(self.backend, method, self._wrap(getattr(self.backend, method), *spec))

    def _wrap(self, fn, out, async_index, inplace):
        out_name, out_index = out

        def deferred(*args, **kwargs):
            is_async = kwargs.get("async_op", args[async_index] if len(args) > async_index else False)
            if self.depth > 0:
                return fn(*args, **kwargs)
            args = list(args)
            if out_name in kwargs:
                target = kwargs[out_name]
                staged = kwargs[out_name] = self.pool.take(target, inplace)
            elif len(args) > out_index:
                target = args[out_index]
                staged = args[out_index] = self.pool.take(target, inplace)
            else:
                raise RuntimeError(f"deferred_comm: cannot find the written tensor '{out_name}' of "
                                   f"{getattr(fn, '__name__', fn)} (args {len(args)}, kwargs {sorted(kwargs)})")
            read = None
            if not inplace:  # what it reads: a private copy too (Note: gloo's threads never hold...)
                name = next((n for n in _INPUT_NAMES if n in kwargs), None)
                if name is not None:
                    read = kwargs[name] = self.pool.take(kwargs[name], True)
                elif len(args) > 1:
                    read = args[1] = self.pool.take(args[1], True)

            def deliver():
                _copy_back(target, staged)
                self.pool.give(staged)
                self.pool.give(read)
            self.depth += 1
            try:
                work = fn(*args, **kwargs)
            finally:
                self.depth -= 1
            if work is None or not is_async:  # a synchronous call: the caller reads the result now
                if work is not None:
                    work.wait()
                deliver()
                return work
            self.deferred += 1
            return DeferredWork(work, deliver)
        return deferred
