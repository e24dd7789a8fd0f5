"""DeepSpeed 0.19.2 on CPUs (gloo): ZeRO-3's coalesced all-gather waits on the last param's
collective only, so a gathered param can be read before its all-gather has written it.
GatheredParameters (and every other gather of several params) then gives uninitialized memory for
some of them, on one rank or both, now and then: stale bytes from an earlier tensor, or NaN when
torch fills uninitialized memory.

_allgather_params_coalesced (deepspeed/runtime/zero/partition_parameters.py:1897 in 0.19.2) launches
one async all_gather_into_tensor per param into a torch.empty buffer and then calls
`launch_handles[-1].wait()` (:1984): "Wait ensures the operation is enqueued, but not necessarily
complete." On one CUDA stream the last collective finishing implies the earlier ones did; gloo's work
handles are independent, so the earlier params' outputs may still be unwritten when the params are
made AVAILABLE and read. 0.19.8 waits on every handle (partition_parameters.py:2111: "gloo handles are
independent ... so every handle must be waited on, not just the last one").

Run (world 2, gloo, CPU; pick the release with PYTHONPATH=<overlay site>):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 600 \
    python -m torch.distributed.run --nproc_per_node 2 09_zero3_gather_waits_on_last_handle.py [--one-by-one]
It builds a small ZeRO-3 engine TRIALS times (default 40), gathers all its params with
GatheredParameters, and compares every rank's copy with the fp32 masters DeepSpeed gathers by
itself (safe_get_full_fp32_param). torch fills uninitialized memory with NaN here
(fill_uninitialized_memory), so a read that comes too early is NaN, not a plausible value.
--one-by-one gathers the params one at a time (one handle each: the workaround); then it passes.
Exit 1 and "DEFECT: ..." when any trial read a wrong param on any rank; exit 0 and "OK: ..." otherwise.
"""
import os
import sys

import torch
import torch.distributed as dist
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param

torch.use_deterministic_algorithms(True, warn_only=True)
torch.utils.deterministic.fill_uninitialized_memory = True
torch.set_num_threads(1)
one_by_one = "--one-by-one" in sys.argv
trials = int(os.environ.get("TRIALS", "40"))

deepspeed.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
config = {"train_micro_batch_size_per_gpu": 2, "zero_allow_untested_optimizer": True,
          "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
wrong = 0
example = ""
for trial in range(trials):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    loss = engine(torch.ones(2, 4)).sum()
    engine.backward(loss)
    engine.step()
    params = list(engine.module.parameters())
    masters = [safe_get_full_fp32_param(p).detach().clone() for p in params]
    if one_by_one:
        read = []
        for p in params:
            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                read.append(p.detach().clone())
    else:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            read = [p.detach().clone() for p in params]
    bad = [i for i, (r, m) in enumerate(zip(read, masters)) if not torch.equal(r, m)]
    flags = torch.tensor([len(bad)])
    dist.all_reduce(flags)
    if flags.item() > 0:
        wrong += 1
        if bad and not example:
            i = bad[0]
            example = (f"trial {trial}, rank {rank}: param {i} {tuple(params[i].ds_shape)} read {read[i].flatten()[:4].tolist()}, "
                       f"its fp32 master {masters[i].flatten()[:4].tolist()}")
    engine.destroy()

examples = [None] * dist.get_world_size()
dist.all_gather_object(examples, example)
head = (f"DeepSpeed {deepspeed.__version__}, ZeRO-3, world {dist.get_world_size()}, gloo, "
        f"GatheredParameters {'one param at a time' if one_by_one else 'of all params at once'}")
if rank == 0:
    if wrong:
        print(f"DEFECT: {head}: {wrong} of {trials} trials read a gathered param that is not its fp32 master; "
              f"first: {next(e for e in examples if e)}")
    else:
        print(f"OK: {head}: every gathered param equals its fp32 master in all {trials} trials")
sys.exit(1 if wrong else 0)
