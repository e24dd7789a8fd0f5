"""Counts DeepSpeed's collectives by kind, calls and bytes, as zerocheck's Comm::stats() does
(engine/comm.h: all_reduce, reduce, broadcast count the tensor's bytes; reduce_scatter its input;
all_gather its output; all_to_all its input).

The patch point is the communication backend object (deepspeed.comm.comm.cdb, a TorchBackend):
every deepspeed.comm function, whichever module imported it by name (coalesced_collectives imports
all_to_all_single), calls through it. A depth guard counts only the outermost call, since the
backend's own methods call one another (all_gather_into_tensor may fall back to all_gather_base).
Collectives issued while `counting` is False (the record's own getters) are not counted."""

import os
import sys
import traceback

_KINDS = {
    "all_reduce": ("all_reduce", 0),
    "all_reduce_coalesced": ("all_reduce", 0),
    "inference_all_reduce": ("all_reduce", 0),
    "reduce": ("reduce", 0),
    "broadcast": ("broadcast", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "all_gather_into_tensor": ("all_gather", 0),
    "all_gather_base": ("all_gather", 0),
    "all_gather": ("all_gather", 0),
    "all_gather_coalesced": ("all_gather", 0),
    "all_to_all_single": ("all_to_all", 1),
    "all_to_all": ("all_to_all", 1),
    "barrier": ("barrier", None),
}
_ARG_NAMES = {0: ("tensor", "output_tensor", "output", "tensors", "output_tensors", "tensor_list"),
              1: ("input_tensor", "input", "input_list", "input_tensor_list")}
KIND_ORDER = ["all_reduce", "reduce_scatter", "all_gather", "reduce", "broadcast", "all_to_all", "barrier"]


def _nbytes(arg):
    if arg is None:
        return 0
    if isinstance(arg, (list, tuple)):
        return sum(_nbytes(a) for a in arg)
    if hasattr(arg, "element_size"):
        return arg.numel() * arg.element_size()
    return 0


class CommCounter:
    def __init__(self, ds_comm):
        import deepspeed.comm.comm as comm_module
        self.backend = comm_module.cdb
        if self.backend is None:
            raise RuntimeError("deepspeed.comm has no backend: call init_distributed first")
        self.counting = False
        self.depth = 0
        self.calls = {k: 0 for k in KIND_ORDER}
        self.bytes = {k: 0 for k in KIND_ORDER}
        self.trace = bool(os.environ.get("ZC_DS_TRACE_COMM"))  # each counted call's DeepSpeed call site, to stderr
        self.seen = set()  # backend methods that were called while counting (the test's coverage check)
        for method, (kind, arg) in _KINDS.items():
            if hasattr(self.backend, method):
                setattr(self.backend, method, self._wrap(method, kind, arg, getattr(self.backend, method)))

    def reset(self):
        self.calls = {k: 0 for k in KIND_ORDER}
        self.bytes = {k: 0 for k in KIND_ORDER}

    def _wrap(self, method, kind, arg, fn):
        def counted(*args, **kwargs):
            outer = self.depth == 0
            if outer and self.counting:
                self.seen.add(method)
                self.calls[kind] += 1
                tensor = None
                if arg is not None:
                    if len(args) > arg:
                        tensor = args[arg]
                    else:
                        names = _ARG_NAMES[arg]
                        tensor = next((kwargs[n] for n in names if n in kwargs), None)
                        if tensor is None:
                            raise RuntimeError(f"comm_counter: cannot find the counted tensor of {method}"
                                               f"(args {len(args)}, kwargs {sorted(kwargs)})")
                    self.bytes[kind] += _nbytes(tensor)
                if self.trace:
                    site = [f for f in traceback.extract_stack()[:-1] if "/deepspeed/" in f.filename and "/comm/" not in f.filename]
                    depth = 4 if os.environ.get("ZC_DS_TRACE_COMM") == "2" else 1  # 2: the four innermost DeepSpeed frames
                    where = " < ".join(f"{f.filename.split('/deepspeed/')[-1]}:{f.lineno} {f.name}" for f in reversed(site[-depth:])) if site else "?"
                    print(f"zc-comm {kind} {method} {_nbytes(tensor)} B at {where}",  # the counted tensor
                          file=sys.stderr)
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
        return counted

    def entries(self):
        out = []
        for k in KIND_ORDER:
            out.append((f"comm/{k}", [float(self.calls[k]), float(self.bytes[k])]))
        return out
