"""What a DeepSpeed worker keeps between scenarios, and its reset (called before every scenario).

A scenario must give the same record in a fresh worker and in a reused one (a test checks it).
Process-global state in DeepSpeed 0.19.8 that one deepspeed.initialize leaves for the next
(paths are the installed package's, deepspeed/...):
- runtime/zero/partition_parameters.py: Init.param_id (every ZeRO-3 param's ds_id; stage3.py sorts
  ipg buckets by it), Init.num_persisted_parameters and num_persisted_elements (counted against
  model_persistence_threshold);
- ops/adam/cpu_adam.py: DeepSpeedCPUAdam.optimizer_id (the C++ optimizer registry's key);
- compile/util.py: dc_handle (the DeepCompile handle);
- utils/groups.py: cached expert / model-parallel groups (none are created by the twins, reset anyway);
- runtime/zero/partition_parameters.py: torch.nn.functional.linear, which zero.Init replaces with
  zero3_linear_wrap (LinearFunctionForZeroStage3) "until manually reset"
  (_enable_mem_efficient_linear, :412) and never restores (its quantized initialization wraps
  linear and embedding alike): a ZeRO-0/1/2 scenario after a ZeRO-3 one ran its Linears through
  ZeRO-3's autograd Function, whose grads come in another order and allocate otherwise (the
  MLP's ZeRO-2 grads read 64 B where a fresh worker reads 112), which no user's ZeRO-2 run does;
- torch's RNG (the twins draw nothing, but DeepSpeed may).
"""
import gc

import torch

# torch's own, taken when the worker starts (before any zero.Init): older releases keep zero.Init's
# backup on the instance (0.14: self.linear_bk), so the reset cannot ask DeepSpeed for it.
_TORCH_LINEAR = torch.nn.functional.linear
_TORCH_EMBEDDING = torch.nn.functional.embedding


def reset_process_state():
    from deepspeed.runtime.zero import partition_parameters as pp
    pp.Init.param_id = 0
    pp.Init.num_persisted_parameters = 0
    pp.Init.num_persisted_elements = 0
    torch.nn.functional.linear = _TORCH_LINEAR
    torch.nn.functional.embedding = _TORCH_EMBEDDING  # zero.Init's quantized init wraps it
    try:
        from deepspeed.ops.adam.cpu_adam import DeepSpeedCPUAdam
        DeepSpeedCPUAdam.optimizer_id = 0
    except ImportError:
        pass
    try:
        import deepspeed.compile.util as dc_util
        dc_util.dc_handle = None
    except ImportError:
        pass
    from deepspeed.utils import groups
    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                 "_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_ALL_TO_ALL_GROUP"):
        cached = getattr(groups, name, None)  # older releases lack some (seed_checks runs any release)
        if cached is not None:
            cached.clear()
    torch.manual_seed(0)
    gc.collect()
    # What survives a full collection is the worker's own state (torch, DeepSpeed, their modules and
    # caches: a million objects), live for the process's life. gc.freeze() moves it out of the
    # collector's sight, so this collect and DeepSpeed's own (ZeRO-3's defragment) scan only what
    # the scenarios allocate since: 0.43 s a collection before, most of a scenario's time. The last
    # scenario's garbage was created after the previous freeze, so it is still collected here.
    gc.freeze()
