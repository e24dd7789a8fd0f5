"""DeepSpeed 0.19.8: an AutoTP engine leaves DeepSpeed's process-wide tensor-parallel groups
behind, so a later engine without TP in the same process fails in _configure_distributed_model.

deepspeed.initialize with `tensor_parallel: {autotp_size: 2}` sets `self.mpu = groups` and
groups._init_tp_mesh_device (deepspeed/runtime/engine.py:957-958), which fills the module globals of
deepspeed/utils/groups.py; engine.destroy() does not clear them. The next engine reads
mp_world_size = groups._get_model_parallel_world_size() (engine.py:2166), gets 2, and calls
self.mpu.get_model_parallel_rank() (engine.py:2169) with its own mpu None.

Run (world 2, gloo, CPU):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 300 \
    python -m torch.distributed.run --nproc_per_node 2 03_autotp_groups_left_behind.py [--plain-first]
--plain-first builds the same two engines in the other order: then both train.
Exit 1 and "DEFECT: ..." when an engine fails; exit 0 and "OK: ..." when both train.
"""
import sys
import traceback
import torch
import deepspeed

PARTITION = {"use_default_specs": False,
             "layer_specs": [{"patterns": [r".*up\.weight$"], "partition_type": "column"},
                             {"patterns": [r".*down\.weight$"], "partition_type": "row"}]}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))).square().mean()


def train_one_step(tp):
    torch.manual_seed(0)
    model = Mlp()
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
    if tp:
        config["tensor_parallel"] = {"autotp_size": 2, "partition_config": PARTITION}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    loss = engine(torch.ones(1, 8))
    engine.backward(loss)
    engine.step()
    engine.destroy()
    return f"{'AutoTP' if tp else 'plain ZeRO-1'} engine: one step, loss {float(loss.detach()):.4f}"


deepspeed.init_distributed(dist_backend="gloo")
rank0 = torch.distributed.get_rank() == 0
lines, status = [], 0
for tp in ((False, True) if "--plain-first" in sys.argv else (True, False)):
    try:
        lines.append(train_one_step(tp))
    except Exception as e:  # noqa: BLE001 - the raise is what we report
        tb = traceback.extract_tb(e.__traceback__)
        ds = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in tb if "/deepspeed/" in f.filename]
        lines.append(f"DEFECT: {'AutoTP' if tp else 'plain ZeRO-1'} engine: {type(e).__name__}: {e}\n"
                     f"  raised at {ds[-1]}")
        status = 1
        break
torch.distributed.barrier()
if rank0:
    print("\n".join(lines if status else lines + ["OK: both engines trained in one process"]))
sys.exit(status)
