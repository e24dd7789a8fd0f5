"""DeepSpeed 0.15.4 through 0.16.1: copy.copy and copy.deepcopy of a ZeRO-3 module's `_parameters`
(a ZeROOrderedDict) raise `TypeError: can only concatenate tuple (not "list") to tuple`.

ZeRO-3 replaces every submodule's `_parameters` with a ZeROOrderedDict (_inject_parameters,
deepspeed/runtime/zero/parameter_offload.py:73-82 in 0.15.4). PR #6527 ("Fix dynamo issue", first in
0.15.4) gave it a __reduce__ (parameter_offload.py:52-54 in 0.15.4):
    r0, _, *r2 = super().__reduce__()
    return (r0, (self._parent_module, )) + r2
The starred r2 is a list, so the tuple + list raises, and copy.copy / copy.deepcopy (both go through
__reduce_ex__) fail before they copy anything. PR #6794 ("Fix type error in ZeROOrderedDict", first
in 0.16.2) made it `+ tuple(r2)`. 0.15.3 and earlier have no __reduce__ (and default parent_module
to None), so the copies work there.

Run (world 1, gloo, CPU; pick the release with PYTHONPATH=<overlay site>):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 300 \
    python -m torch.distributed.run --nproc_per_node 1 05_zero_ordered_dict_reduce.py [--patch]
--patch puts PR #6794's __reduce__ on ZeROOrderedDict first (the workaround): then it passes.
Exit 1 and "DEFECT: ..." when a copy raises; exit 0 and "OK: ..." when both copies work.
"""
import copy
import sys
import torch
import deepspeed


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).sum()


if "--patch" in sys.argv:
    from deepspeed.runtime.zero.parameter_offload import ZeROOrderedDict

    def fixed_reduce(self):
        r0, _, *r2 = super(ZeROOrderedDict, self).__reduce__()
        return (r0, (self._parent_module, )) + tuple(r2)
    ZeROOrderedDict.__reduce__ = fixed_reduce

deepspeed.init_distributed(dist_backend="gloo")
model = Tiny()
config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
          "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
params = engine.module.lin._parameters
head = (f"DeepSpeed {deepspeed.__version__}{' + PR #6794 patch' if '--patch' in sys.argv else ''}, ZeRO-3: "
        f"engine.module.lin._parameters is {type(params).__name__}")
failed = []
for name, fn in (("copy.copy", copy.copy), ("copy.deepcopy", copy.deepcopy)):
    try:
        out = fn(params)
        ok = list(out.keys()) == list(params.keys()) and out._parent_module is not None
        print(f"{name}: {type(out).__name__} with keys {list(out.keys())}" + ("" if ok else " (wrong copy)"))
        failed += [] if ok else [name]
    except Exception as e:  # noqa: BLE001 - the raise is what we report
        print(f"{name}: {type(e).__name__}: {e}")
        failed.append(name)
engine.destroy()
if failed:
    print(f"DEFECT: {head}; {' and '.join(failed)} of it failed")
    sys.exit(1)
print(f"OK: {head}; copy.copy and copy.deepcopy of it work")
sys.exit(0)
