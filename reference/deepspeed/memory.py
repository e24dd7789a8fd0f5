"""DeepSpeed's CPU memory over one reference scenario, allocation by allocation, in zerocheck's categories.

Method (Note [DeepSpeed's memory, measured] in props/reference_memory.cpp says how the two sides meet):
torch.profiler with profile_memory and with_stack records every CPU allocation and free torch's
allocator makes (c10's CPU allocator reports each one to the profiler: size, pointer, time) with the
Python frames and aten ops around it. The profiler's event tree (kineto_results.experimental_event_tree)
keeps those records; FunctionEvent lists fold most of them into the enclosing op, so the tree is read.
The record is checked complete and in order (the allocator's running total chains through every
event; analyse() raises otherwise). What torch's allocator does not serve is not seen: gloo's own staging buffers and DeepSpeed's C++
ops' internal buffers (none in the twin's configurations: CPU Adam steps in place).

Each allocation gets one category, first match wins:
1. identity: the storages DeepSpeed holds, found by walking the engine at snapshots (after
   construction, after each forward, backward and step; snapshot()): module params and ZeRO-3
   partitions (params), gathered ZeRO-3 params (gathered_params, persistent), .grad and the ZeRO
   optimizers' gradient partitions and buffers (grads), fp32 master partitions (master), optimizer
   state (optimizer_states), ipg buffers (ipg_buckets);
2. tensors autograd saves for backward (torch.autograd.graph.saved_tensors_hooks) that were
   allocated in the forward (activations), each param's gradient as autograd hands it to
   AccumulateGrad (a tensor hook on the param: grads), and ZeRO-1/2's fp32 gradient partition of
   16-bit params as its step hands it to the optimizer (watch_step_grads: grads);
3. a Python number an op takes, wrapped in a 0-dim tensor (HOST), and the CPU kernel's cast of it
   (CPU_KERNEL): kept apart, as a GPU run holds neither in device memory (before the call site:
   a reduce-scatter's divisor is not its staging);
4. the allocating call site: SITE_CATEGORIES maps DeepSpeed's functions to a category
   (comm_buffers for the flattened buckets, reduce-scatter staging and the coalesced all-gather's
   flat buffer; gathered_params for the params ZeRO-3 gathers; grads for ZeRO-3's step partition);
   a gathered param that autograd saves stays a gathered param; the transformer twin's code and the checkpoint functions (MODEL_TWIN, MODEL_FILES),
   and autograd's backward (not a DeepSpeed hook that an autograd node runs: _in_backward_op), to
   activations; torch's RNG state to HOST and torch's printing of a tensor to LOG_FORMAT (both kept
   apart);
5. the rest is temporaries (0-dim norms and flags, casts).

The recorder's own reads (the twin's full grads, params and states) run inside excluded(): what they
allocate and free there is not counted; what survives the region (ZeRO-3's re-gather of the params
that were available) is counted as allocated at the region's end.
"""
import contextlib
import os

import torch

CATEGORIES = ("params", "grads", "master", "optimizer_states", "ipg_buckets", "comm_buffers", "gathered_params",
              "prefetch", "persistent", "activations", "temporaries")
# What torch's gloo backend allocates inside a collective (its staging of all_gather_into_tensor and
# reduce_scatter_tensor, on the caller's thread under torch/distributed or DeepSpeed's comm wrapper,
# or on gloo's own thread with no Python frame at all). NCCL on a GPU writes into the caller's
# tensors: a CPU-path difference, kept apart from the total that is compared and reported on its own.
CPU_BACKEND = "cpu_backend"
# What a GPU run keeps in host memory too, so not the device memory the engine's ledger and a plan
# count: the RNG states an activation checkpoint keeps and restores (torch.get_rng_state() in
# torch.utils.checkpoint's CheckpointFunction and fork_rng, and in deepspeed.checkpointing's, whose
# accelerator state is torch's CPU state here), and deepspeed.checkpointing's size tensors under
# partition_activations (torch.tensor(arg.size()), always a CPU tensor). Kept apart like CPU_BACKEND.
HOST = "host"
# A Python number an op takes (tensor.div_(w), loss * scale): torch wraps it in a 0-dim CPU tensor
# (scalar_to_tensor, no aten op around it), which a GPU run keeps on the host too (HOST). Where
# the op's dtype differs (an f32 tensor by a Python float), the CPU kernel's TensorIterator casts
# that scalar through a temporary (aten::to inside the op); a CUDA kernel reads a CPU scalar as an
# argument and casts it in registers, so on a GPU that temporary does not exist at all: CPU_KERNEL.
# Both kept apart (the engine keeps the numbers it divides and scales by on the host).
CPU_KERNEL = "cpu_kernel"
# The profiler's event around an autograd node's run; the node's own event (its name) is inside.
AUTOGRAD_NODE = "autograd::engine::evaluate_function: "
# torch's printing of a tensor (torch/_tensor_str.py: the masks, the masked_select, the abs and its
# f64 copy, a ceil per value that it uses to choose a format). DeepSpeed's ZeRO-3 constructor
# formats its arguments into a log line it does not print (stage3.py:214, print_rank_0(f"... {locals()}",
# force=False)): param_names's keys are the module's params, so a model built outside zero.Init
# has each full param printed there, on a GPU as here. Value-dependent (how many values are zero or
# integral), transient (freed before the next statement) and not training's memory: the engine and
# a plan do not model it, so it is kept apart, reported on its own, by where it is allocated
# (a frame in torch/_tensor_str.py), never by a bound that could cover anything else.
LOG_FORMAT = "log_format"
KEPT_APART = (CPU_BACKEND, HOST, CPU_KERNEL, LOG_FORMAT)
# The transformer twin's code, the functions that run a checkpointed layer and ZeRO-3's linear
# (DeepSpeed's replacement of F.linear under ZeRO-3, the model's own matmuls): what they allocate
# (every intermediate of the forward, kept or not, the layers' outputs under no_grad, the
# recomputation) is an activation, as the engine counts its models' forward and backward, unless
# a DeepSpeed frame inside them (ZeRO-3's hooks) decides it.
MODEL_FILES = ("torch/utils/checkpoint.py", "deepspeed/runtime/activation_checkpointing/checkpointing.py",
               "deepspeed/runtime/zero/linear.py")
# A 0-dim tensor (the loss, a Python number wrapped as a tensor) is at most 8 bytes; every
# activation of the twin's models is larger.
SCALAR_BYTES = 8
MODEL_TWIN = "transformer_twin.py"  # its frames name it as the worker imported it, often without a directory

# (file suffix, function) of the innermost DeepSpeed frame -> category; None matches any function.
SITE_CATEGORIES = [
    # Stage 0 and the bf16 wrapper's boundary all-reduce: the flattened bucket (and its cast to the
    # communication dtype), one per call.
    ("runtime/engine.py", "allreduce_bucket", "comm_buffers"),
    ("runtime/zero/stage_1_and_2.py", "setup_buckets", "ipg_buckets"),
    ("runtime/zero/stage_1_and_2.py", "allreduce_bucket", "comm_buffers"),
    ("runtime/zero/stage_1_and_2.py", "average_tensor", "comm_buffers"),
    ("runtime/zero/stage_1_and_2.py", "_get_compact_grad_partition_buffer", "grads"),
    ("runtime/zero/stage_1_and_2.py", "_build_compact_grad_partition_buffer", "grads"),
    # A frame names its function as written (co_name): __avg_scatter_grads, never the mangled
    # _DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads that attribute access uses.
    ("runtime/zero/stage3.py", "__avg_scatter_grads", "comm_buffers"),
    # The step's fp32 gradient partition: averaged_gradients flattened (and cast) into the tensor
    # the optimizer steps as fp32_partitioned_groups_flat[i].grad, freed by _release_sub_group
    # before any snapshot sees it. The engine's step holds the same tensor as grads.
    ("runtime/zero/stage3.py", "_prepare_fp32_grad_for_sub_group", "grads"),
    ("runtime/zero/stage3.py", "__avg_scatter_contiguous_grads", "comm_buffers"),
    ("runtime/zero/partition_parameters.py", "_allgather_params", "gathered_params"),
    # Init._all_gather of one param (construction's create_reduce_and_remove_grad_hooks gathers
    # each param once so): its full data, a gathered param until it is partitioned again.
    ("runtime/zero/partition_parameters.py", "_allgather_params_sequential", "gathered_params"),
    ("runtime/zero/partition_parameters.py", "_allgather_params_coalesced", "gathered_params"),
    ("runtime/zero/partition_parameters.py", "all_gather_coalesced", "gathered_params"),
    # The coalesced fetch's flat buffer of every rank's shards (gathered in place, freed once the
    # params are cut out of it): all-gather staging, as the engine counts it.
    ("runtime/zero/partition_parameters.py", "_all_gather_dtype", "comm_buffers"),
    # AllGatherCoalescedHandle.wait (:795): each param's full data cut out of the gathered flat
    # buffer (torch.cat), in a module's pre-forward or pre-backward fetch and in a checkpoint's
    # recomputation, where autograd's rule would otherwise call it an activation.
    ("runtime/zero/partition_parameters.py", "wait", "gathered_params"),
    # Each argument's size (host) and the 0-dim placeholder its .data becomes (device: a scalar,
    # temporaries by size in analyse()).
    ("runtime/activation_checkpointing/checkpointing.py", "get_partitioned_activations_for_backward", HOST),
]

MARK = "zc:mark:"
EXCLUDED = "zc:excluded"  # not counted at all (the twin's inputs)
LOG = bool(os.environ.get("ZC_DS_MEMORY_LOG"))  # every counted event kept with its op and frame
READING = "zc:reading"    # the recorder's reads: what survives them is counted from their end
LABEL = "zc:category:"    # allocations inside are this category


def _frame_file(name):
    """'deepspeed/runtime/zero/stage3.py(123): fn' -> ('runtime/zero/stage3.py', 123, 'fn')."""
    head, _, fn = name.partition("): ")
    path, _, line = head.rpartition("(")
    return path, line, fn


class MemoryRecorder:
    """Wraps a scenario: start() before the model is built, mark() at phase boundaries, excluded()
    around the recorder's reads, snapshot() at points where DeepSpeed's state is known, finish() for
    the figures."""

    def __init__(self):
        self.prof = None
        self.identity = []  # {ptr: category} per snapshot, at the time of marker snap:<i>
        self.saved = []     # ptr of each tensor saved for backward, at the time of marker saved:<i>
        self.grads = []     # ptr of each param's gradient from autograd, at the time of marker grad:<i>
        self.hooks = []     # watch_grads()'s, removed by finish(): a hook would keep this recorder, and
                            # the profiler's whole record, alive as long as the model
        self.error = ""

    def start(self):
        # Python's cyclic collector frees what reference cycles hold at moments that depend on the
        # process's history. Collected at the start and off while measuring, so that its timing is
        # not one more source of run-to-run movement: what cycles hold counts until the scenario
        # ends. (Some figures still move between runs: docs/deepspeed-reference.md, "run to run".)
        import gc
        gc.collect()
        gc.disable()
        from torch.profiler import ProfilerActivity, profile
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True,
                            record_shapes=False, acc_events=True)
        self.prof.__enter__()

    def mark(self, name):
        with torch.profiler.record_function(MARK + name):
            pass

    # Ranges analyse() reads back from the event tree by name.
    def excluded(self):
        return torch.profiler.record_function(EXCLUDED)

    def labelled(self, category):
        """Allocations inside are `category` (after identity): the twin's per-micro-batch inputs,
        which zerocheck's engine uploads as activations."""
        assert category in CATEGORIES
        return torch.profiler.record_function(LABEL + category)

    def reading(self):
        return torch.profiler.record_function(READING)

    @contextlib.contextmanager
    def forward(self):
        """Tensors saved for backward while the model's forward runs."""
        def pack(t):
            ptr = _storage(t)
            if ptr is not None:
                self.saved.append(ptr)
                self.mark(f"saved:{len(self.saved) - 1}")
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def watch_grads(self, module):
        """Each param's gradient as autograd hands it to AccumulateGrad, which keeps that tensor as
        .grad (ZeRO-1/2's hooks then copy it into a bucket and drop it): grads, as the engine's
        .grad, though no snapshot sees it live."""
        for p in module.parameters():
            if p.requires_grad:
                self.hooks.append(p.register_hook(self._grad_seen))

    def _grad_seen(self, g):
        """g, live now, is grads (the marker grad:<i> dates it)."""
        ptr = _storage(g)
        if ptr is not None:
            self.grads.append(ptr)
            self.mark(f"grad:{len(self.grads) - 1}")

    def watch_step_grads(self, optimizer):
        """ZeRO-1/2's fp32 gradient partition, as the step hands it to the torch optimizer
        (stage_1_and_2.py step(): the flat partition cast to the masters' dtype, set as
        single_partition_of_fp32_groups[i].grad, stepped by _optimizer_step(i), dropped after):
        grads, as ZeRO-3's _prepare_fp32_grad_for_sub_group is and as the engine's step holds it,
        where the cast makes a new tensor (16-bit params: no snapshot sees it). In f32 the cast
        returns the flat partition itself, the flatten's, a temporary on both sides (the engine's
        step flattens into a temporary too). Under offload the partition is the persistent pinned
        buffer, which identity names first."""
        groups = getattr(optimizer, "single_partition_of_fp32_groups", None)
        bit16 = getattr(optimizer, "bit16_groups", None)
        inner = getattr(optimizer, "_optimizer_step", None)
        if groups is None or bit16 is None or inner is None:
            return

        def stepped(i):
            g = groups[i].grad
            if g is not None and bit16[i] and bit16[i][0].dtype != g.dtype:
                self._grad_seen(g)
            return inner(i)
        optimizer._optimizer_step = stepped

    def snapshot(self, engine=None, module=None):
        """The storages DeepSpeed holds now, by category (identity); before deepspeed.initialize,
        the module's params. A failure here is kept for finish() to raise: the scenario's values
        must not depend on the recorder."""
        with self.reading():
            try:
                held = holdings(engine) if engine is not None else {
                    _storage(p.data): "params" for p in module.parameters() if _storage(p.data) is not None}
            except Exception as e:  # noqa: BLE001
                self.error = self.error or f"snapshot: {type(e).__name__}: {e}"
                held = {}
            self.identity.append(held)
            self.mark(f"snap:{len(self.identity) - 1}")

    def finish(self):
        import gc
        self.prof.__exit__(None, None, None)
        for h in self.hooks:
            h.remove()
        self.hooks = []
        gc.enable()
        try:
            if self.error:
                raise RuntimeError(self.error)
            return analyse(self)
        finally:
            self.prof = None  # the record (millions of events in a long run) goes with this scenario


def _storage(t):
    if t is None or not torch.is_tensor(t) or t.device.type != "cpu":
        return None
    s = t.untyped_storage()
    return s.data_ptr() if s.nbytes() > 0 else None


def holdings(engine):
    """{storage pointer: category} for what the engine and its optimizer hold."""
    out = {}

    def put(t, cat):
        p = _storage(t)
        if p is not None and p not in out:
            out[p] = cat

    def put_all(obj, cat, depth=0):
        if torch.is_tensor(obj):
            put(obj, cat)
        elif isinstance(obj, dict) and depth < 4:
            for v in obj.values():
                put_all(v, cat, depth + 1)
        elif isinstance(obj, (list, tuple)) and depth < 4:
            for v in obj:
                put_all(v, cat, depth + 1)

    opt = engine.optimizer
    params = list(engine.module.parameters())
    from_ds3 = any(hasattr(p, "ds_tensor") for p in params)
    for p in params:
        if from_ds3:
            put(p.ds_tensor, "params")
            if p.data.numel() > 0:
                put(p.data, "persistent" if getattr(p, "ds_persist", False) else "gathered_params")
        else:
            put(p.data, "params")
        put(p.grad, "grads")
    for name in ("bit16_groups_flat", "fp16_groups_flat", "fp16_partitioned_groups_flat"):
        put_all(getattr(opt, name, None), "params")
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat",
                 "fp32_groups", "fp32_groups_flat_partition"):
        put_all(getattr(opt, name, None), "master")
    # ZeRO-1/2 offload keeps its fp32 grad partition as the master's .grad for the optimizer's life
    # (initialize_optimizer_states), and three staging buffers (Note [ZeRO-1/2 offload's staging
    # buffers] in engine/zero12_optimizer.h).
    for t in getattr(opt, "single_partition_of_fp32_groups", None) or []:
        if torch.is_tensor(t):
            put(t.grad, "grads")
    for name in ("param_buffer_of_bit16_for_cpu_offload_groups", "temp_grad_buffer_for_cpu_offload",
                 "temp_grad_buffer_for_gpu_offload"):
        put_all(getattr(opt, name, None), "comm_buffers")
    inner = opt
    while hasattr(inner, "optimizer") and not isinstance(inner, torch.optim.Optimizer):
        inner = inner.optimizer
    if isinstance(inner, torch.optim.Optimizer):
        for st in inner.state.values():
            put_all(st, "optimizer_states")
        # What the base optimizer steps and is neither a module param nor a named master above
        # (put keeps the first category) is an fp32 master all the same.
        for g in inner.param_groups:
            for p in g["params"]:
                put(p, "master")
    for name in ("averaged_gradients", "averaged_gradients_on_cpu", "grad_partitions_flat_buffer",
                 "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition", "grads_in_partition",
                 "single_partition_of_fp32_groups_grads", "accumulated_grads_in_cpu", "fp32_groups_gradients_flat",
                 "grads_in_ipg_bucket"):
        put_all(getattr(opt, name, None), "grads")
    put_all(getattr(opt, "ipg_buffer", None), "ipg_buckets")
    buckets = getattr(opt, "ipg_buckets", None)
    for bucket in buckets.values() if isinstance(buckets, dict) else []:
        put_all(getattr(bucket, "buffer", None), "ipg_buckets")  # a list: one buffer, two with overlap_comm
    return out


def _name(e):
    try:
        return e.name
    except UnicodeDecodeError:  # the Python tracer's name of a C function, now and then
        return "<undecodable>"


def _context(e):
    """The names that attribution reads around an allocation, outermost first: Python frames and
    autograd's evaluate_function nodes (parents walked only here: a tuple per node of a long run's
    tree would cost gigabytes)."""
    out = []
    p = e.parent
    while p is not None:
        n = _name(p)
        if ".py(" in n or n.startswith(AUTOGRAD_NODE):
            out.append(n)
        p = p.parent
    out.reverse()
    return tuple(out)


def _is_alloc(e):
    return str(e.tag).endswith("Allocation")


def _cpu_scalar(e, last_under):
    """HOST for a Python number's wrapped 0-dim tensor, CPU_KERNEL for the CPU kernel's cast of it
    inside the op that takes it (see CPU_KERNEL), else None. The wrapped number: at most 8 bytes,
    allocated with no aten op around it, directly under a Python frame or builtin method. Its cast:
    at most 8 bytes, empty_strided <- _to_copy <- to <- an aten op, whose caller's last allocation
    before the op is a wrapped number, or which is the mul or div of the backward node of
    `t * number` or `t / number` (MulBackward0, DivBackward0: the number was wrapped and saved in
    the forward; the loss's scaling by DeepSpeed and the models' means). last_under: each event's
    (by id) last allocation child so far, as _tree's walk (in time order) has classified it: a
    frame running thousands of ops is not searched again for each."""
    size = e.extra_fields.alloc_size
    if not 0 < size <= SCALAR_BYTES or e.parent is None:
        return None
    p = e.parent
    name = _name(p)
    if not name.startswith("aten::"):
        return HOST if (".py(" in name or name.startswith("<built-in")) else None
    chain = [p]
    while len(chain) < 4 and chain[-1].parent is not None:
        chain.append(chain[-1].parent)
    if len(chain) < 4 or [_name(x) for x in chain[:3]] != ["aten::empty_strided", "aten::_to_copy", "aten::to"]:
        return None
    op, caller = chain[3], chain[3].parent
    if not _name(op).startswith("aten::") or caller is None:
        return None
    if _name(op) in ("aten::mul", "aten::div") and caller.parent is not None and \
            _name(caller.parent) == f"{AUTOGRAD_NODE}{_name(caller)}":
        return CPU_KERNEL  # the node of `t * number` or `t / number`, with the number it saved
    return CPU_KERNEL if last_under.get(caller.id) == HOST else None


def _tree(prof):
    """(allocations, markers, excluded ranges, reading ranges) from the profiler's event tree, in time order."""
    roots = prof.profiler.kineto_results.experimental_event_tree()
    allocs, marks, excluded, reading, labelled = [], [], [], [], []
    last_under = {}  # _cpu_scalar's: an event's id -> its last allocation child's class
    stack = list(reversed(roots))
    while stack:
        e = stack.pop()
        if _is_alloc(e):
            ef = e.extra_fields
            scalar = _cpu_scalar(e, last_under)
            if ef.alloc_size > 0 and e.parent is not None:
                last_under[e.parent.id] = scalar
            if ef.device.type == "cpu":
                allocs.append({"t": e.start_time_ns, "size": ef.alloc_size, "ptr": ef.ptr, "total": ef.total_allocated,
                               "ctx": _context(e) if ef.alloc_size > 0 else (), "scalar": scalar,
                               "op": _name(e.parent) if LOG and e.parent is not None and ef.alloc_size > 0 else ""})
            continue
        name = _name(e)
        if name.startswith(MARK):
            marks.append((e.start_time_ns, name[len(MARK):]))
        elif name == EXCLUDED:
            excluded.append((e.start_time_ns, e.end_time_ns))
        elif name == READING:
            reading.append((e.start_time_ns, e.end_time_ns))
        elif name.startswith(LABEL):
            labelled.append((e.start_time_ns, e.end_time_ns, name[len(LABEL):]))
        stack.extend(reversed(e.children))  # popped in order: ties in time keep the tree's order
    allocs.sort(key=lambda a: a["t"])  # stable
    marks.sort()
    return allocs, marks, excluded, reading, labelled


def _innermost(ctx):
    """The innermost Python frame and autograd node around an allocation (ZC_DS_MEMORY_LOG's detail)."""
    frames = [c for c in ctx if ".py(" in c]
    nodes = [c.rsplit(": ", 1)[-1] for c in ctx if c.startswith(AUTOGRAD_NODE)]
    where = ""
    if frames:
        path, line, fn = _frame_file(frames[-1])
        where = f"{os.path.basename(path)}:{line} {fn}"
    return where + (f" [{nodes[-1]}]" if nodes else "")


def _in_backward_op(ctx):
    """Inside an autograd node's evaluation and not in a DeepSpeed hook that it runs (ZeRO-1/2's
    gradient hooks run inside AccumulateGrad: their norms and overflow tests are not
    activations)."""
    nodes = [i for i, c in enumerate(ctx) if c.startswith(AUTOGRAD_NODE)]
    inside = ctx[nodes[-1]:] if nodes else []
    return bool(nodes) and not any(".py(" in c and "deepspeed/runtime/" in c for c in inside)


def site_of(ctx):
    """The innermost DeepSpeed frame, 'runtime/zero/stage3.py:123 fn', or the innermost frame."""
    frames = [c for c in ctx if ".py(" in c]
    for c in reversed(frames):
        if "deepspeed/" in c:
            path, line, fn = _frame_file(c)
            return path.split("deepspeed/", 1)[1] + ":" + line + " " + fn
    if frames:
        path, line, fn = _frame_file(frames[-1])
        return os.path.basename(path) + ":" + line + " " + fn
    return "?"


def category_by_site(ctx):
    frames = [c for c in ctx if ".py(" in c]
    if not frames:
        return CPU_BACKEND  # a backend thread's allocation (gloo's)
    innermost = _frame_file(frames[-1])[0]
    if innermost.endswith(("torch/distributed/distributed_c10d.py", "deepspeed/comm/torch.py", "deferred_comm.py")):
        return CPU_BACKEND
    if innermost.endswith("torch/random.py"):
        return HOST
    if any(_frame_file(c)[0].endswith("torch/_tensor_str.py") for c in frames):
        return LOG_FORMAT
    inside_deepspeed = False  # a DeepSpeed frame inside the model's (ZeRO-3's hooks)
    for c in reversed(frames):
        path, _, fn = _frame_file(c)
        if "deepspeed/" in c:
            for suffix, func, cat in SITE_CATEGORIES:
                if path.endswith(suffix) and (func is None or fn == func):
                    return cat
        if path.endswith(MODEL_FILES) or os.path.basename(path) == MODEL_TWIN:
            return None if inside_deepspeed else "activations"
        inside_deepspeed = inside_deepspeed or "deepspeed/" in c
    return None


# How far apart in the profiler's time order two events may be that the allocator ordered the
# other way (gloo's threads allocate inside collectives while the caller's thread does).
REORDER_WINDOW = 16


def _in_allocator_order(allocs):
    """The events in the order of the allocator's running total, where the profiler's timestamps
    (taken on different threads) put a few the other way round: each next event is the first within
    REORDER_WINDOW whose total before it (total - size) is the last one's total after. An event
    that fits nowhere stays where it was, and the chain check below refuses the record."""
    import collections
    import itertools
    if not allocs:
        return allocs
    out, pending = [allocs[0]], collections.deque(allocs[1:])
    while pending:
        cur = out[-1]["total"]
        k = next((k for k, a in enumerate(itertools.islice(pending, REORDER_WINDOW)) if a["total"] - a["size"] == cur), 0)
        out.append(pending[k])
        del pending[k]
    return out


def _pair(events):
    """Pairs each allocation with its free: free_t on the allocation, alloc on the free.

    An allocation at a pointer still live means the earlier one's free is not in the record. Seen
    on gloo's reduce_scatter_tensor staging (allocated on the caller's thread, freed where the
    profiler does not see it; the allocator's running total still chains, so an unseen allocation
    of the same size cancels it). Without this the staging stayed live to the end of the record,
    and a snapshot that found a persistent param at its pointer counted the staging as that param:
    1,024 to 10,752 B of persistent or grads on a rank of most ZeRO-3 llama-tiny runs, varying run
    to run. The earlier allocation is taken as freed when its pointer is handed out again: an upper
    bound on its lifetime (the staging is CPU_BACKEND, kept apart from what is compared), and
    flagged free_unrecorded for the timeline."""
    live = {}
    for a in events:
        if a["size"] > 0:
            if (b := live.get(a["ptr"])) is not None:
                b["free_t"] = a["t"]
                b["free_unrecorded"] = True
            live[a["ptr"]] = a
        else:
            b = live.pop(a["ptr"], None)
            if b is not None:
                b["free_t"] = a["t"]
                a["alloc"] = b


def analyse(rec):
    allocs, marks, excluded, reading, labelled = _tree(rec.prof)
    allocs = _in_allocator_order(allocs)
    # The record is complete and in order: each event's size moves the allocator's own running
    # total (total_allocated) from the previous event's to its own. A lost or misplaced event
    # breaks the chain, and then the figures would be wrong: an error instead.
    for i in range(1, len(allocs)):
        if allocs[i - 1]["total"] + allocs[i]["size"] != allocs[i]["total"]:
            raise RuntimeError(f"the profiler's record is incomplete or out of order at event {i} of {len(allocs)}: "
                               f"the allocator's total goes {allocs[i - 1]['total']} -> {allocs[i]['total']} "
                               f"on an event of {allocs[i]['size']} B")

    def range_of(t, ranges):
        return next((r for r in ranges if r[0] <= t <= r[1]), None)

    # Excluded ranges: allocations inside are dropped with their frees. Reading ranges: dropped
    # unless they outlive the range, then counted from its end.
    events, dropped = [], set()
    for a in allocs:
        if a["size"] > 0:
            if range_of(a["t"], excluded):
                dropped.add(id(a))
            elif (r := range_of(a["t"], reading)) is not None:
                a["moved_to"] = r[1]
        events.append(a)
    _pair(events)
    for a in events:
        if a["size"] > 0 and "moved_to" in a and a.get("free_t", float("inf")) <= a["moved_to"]:
            dropped.add(id(a))
    # Identity snapshots and saved tensors: the allocation live at that time with that pointer.
    by_ptr = {}
    for a in events:
        if a["size"] > 0 and id(a) not in dropped:
            by_ptr.setdefault(a["ptr"], []).append(a)

    def owner(ptr, t):
        for a in by_ptr.get(ptr, []):
            if a["t"] <= t < a.get("free_t", float("inf")):
                return a
        return None
    at = {n: t for t, n in marks}
    for i, held in enumerate(rec.identity):
        t = at[f"snap:{i}"]
        for ptr, cat in held.items():
            a = owner(ptr, t)
            if a is not None and "cat" not in a:
                a["cat"], a["how"] = cat, "identity"
    # A gathered ZeRO-3 param that autograd saves (ZeRO-3's linear saves its weight) is still the
    # param: the coordinator's release frees it, not the backward. Its site decides, below.
    for i, ptr in enumerate(rec.saved):
        a = owner(ptr, at[f"saved:{i}"])
        if a is not None and "cat" not in a and category_by_site(a["ctx"]) != "gathered_params":
            a["cat"], a["how"] = "activations", "saved for backward"
    for i, ptr in enumerate(rec.grads):
        a = owner(ptr, at[f"grad:{i}"])
        if a is not None and "cat" not in a:
            a["cat"], a["how"] = "grads", "a param's gradient"
    for a in events:
        if a["size"] > 0 and "cat" not in a:
            r = next((r for r in labelled if r[0] <= a["t"] <= r[1]), None)
            if r is not None:
                a["cat"], a["how"] = r[2], "labelled"
    # What survives a reading range is the recorder's output unless DeepSpeed holds it.
    for a in events:
        if a["size"] > 0 and "moved_to" in a and a.get("how") != "identity":
            dropped.add(id(a))
    for a in events:
        if a["size"] > 0 and "cat" not in a and a.get("scalar") is not None:
            a["cat"], a["how"] = a["scalar"], "a Python number's scalar"
    for a in events:
        if a["size"] > 0 and "cat" not in a:
            cat = category_by_site(a["ctx"])
            if cat in ("activations", HOST) and a["size"] <= SCALAR_BYTES:
                cat = "temporaries"  # a 0-dim scalar: the engine keeps the model's on the host
            elif cat is None and _in_backward_op(a["ctx"]):
                cat = "activations"  # an activation's gradient, alive between two backward ops
            a["cat"], a["how"] = cat or "temporaries", "site" if cat else "rest"
    # The timeline, phase by phase.
    timeline = []  # (t, delta, alloc)
    for a in events:
        if a["size"] > 0:
            if id(a) in dropped:
                continue
            timeline.append((a.get("moved_to", a["t"]), a["size"], a))
            if a.get("free_unrecorded"):  # freed unseen: gone when its pointer is handed out again
                timeline.append((a["free_t"], -a["size"], a))
        elif "alloc" in a and id(a["alloc"]) not in dropped:
            timeline.append((a["t"], a["size"], a["alloc"]))
    timeline.sort(key=lambda x: x[0])
    out = phases(timeline, [(t, n) for t, n in marks if not n.startswith(("snap:", "saved:", "grad:"))])
    out["events"] = len(allocs)
    if LOG:  # every counted event, for comparing with the engine's ledger by hand
        out["log"] = [[delta, a["cat"], site_of(a["ctx"]), a["op"], _innermost(a["ctx"])] for _, delta, a in timeline]
        out["log_marks"] = [[sum(1 for t, _, _ in timeline if t < mt), n] for mt, n in marks
                            if not n.startswith(("snap:", "saved:", "grad:"))]
    return out


def phases(timeline, marks):
    """{"construction": stats, "steps": [stats], ...}: peak, composition at the peak, each category's
    peak, and the live bytes at the phase's marks."""
    bounds = [t for t, _ in marks]
    names = [n for _, n in marks]
    live = dict.fromkeys(CATEGORIES + KEPT_APART, 0)

    def compared():  # the total the engine's is compared with: gloo's staging and host memory apart
        return sum(v for c, v in live.items() if c not in KEPT_APART)
    out, cur = {}, None
    mi = 0

    def open_phase(name):
        total = compared()
        return {"name": name, "peak": total, "at_peak": dict(live), "peak_by_category": dict(live),
                "peak_site": "", "marks": {}}

    cur = open_phase("before")
    order = []
    for t, delta, a in timeline + [(float("inf"), 0, None)]:
        while mi < len(bounds) and bounds[mi] <= t:
            name = names[mi]
            if name.startswith("begin:"):
                if cur["name"] != "before":
                    order.append(cur)
                cur = open_phase(name[len("begin:"):])
            else:
                cur["marks"][name] = compared()
            mi += 1
        if a is None:
            break
        live[a["cat"]] += delta
        total = compared()
        for c, v in live.items():
            if v > cur["peak_by_category"][c]:
                cur["peak_by_category"][c] = v
        if total > cur["peak"]:
            cur["peak"], cur["at_peak"] = total, dict(live)
            cur["peak_site"] = f"{a['cat']} {a['size']} B at {site_of(a['ctx'])}"
    order.append(cur)
    cur["marks"]["end"] = compared()
    return {"phases": order, "live_at_end": dict(live)}
