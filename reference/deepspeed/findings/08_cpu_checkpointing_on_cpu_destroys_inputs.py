"""DeepSpeed 0.19.8: deepspeed.checkpointing with cpu_checkpointing on the CPU accelerator destroys
every checkpointed input in the forward, so the backward's recomputation fails.

CheckpointFunction.forward (runtime/activation_checkpointing/checkpointing.py) copies the inputs
to the CPU with copy_to_device(args, torch.device('cpu')) (:613-614; runtime/utils.py:156-157 is
`item.to(device)`), which on the CPU accelerator returns the same tensor object, not a copy. After
the layer's forward, get_cpu_activations_for_backward (:639-640 -> :491-492) sets
`arg.data = torch.empty([])` and then `arg.saved_data = inp.data`: `inp` is `arg`, so the saved
data is the empty placeholder and the input's storage is gone. The backward restores the
placeholder (:700-703) and the recomputed layer fails. (On a GPU the copy is a real one.)

Run (world 1, gloo, CPU):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 300 \
    python -m torch.distributed.run --nproc_per_node 1 08_cpu_checkpointing_on_cpu_destroys_inputs.py [--no-cpu-checkpointing]
--no-cpu-checkpointing configures the same checkpointing without it: then the gradients equal
those of the model without checkpointing.
Exit 1 and "DEFECT: ..." when the backward fails or the gradients differ; exit 0 and "OK: ..." when
they equal the plain model's.
"""
import sys
import traceback

import torch
import deepspeed


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def grads(layers, checkpoint):
    for p in layers.parameters():
        p.grad = None
    x = torch.ones(4, 16, requires_grad=True).clone()  # a non-leaf, as a layer stack's input is
    for layer in layers:
        x = deepspeed.checkpointing.checkpoint(layer, x) if checkpoint else layer(x)
    x.square().mean().backward()
    return [p.grad.clone() for p in layers.parameters()]


deepspeed.init_distributed(dist_backend="gloo")
cpu = "--no-cpu-checkpointing" not in sys.argv
deepspeed.checkpointing.configure(None, checkpoint_in_cpu=cpu)
torch.manual_seed(0)
layers = torch.nn.ModuleList(Layer() for _ in range(3))
want = grads(layers, checkpoint=False)
what = f"deepspeed.checkpointing.checkpoint with checkpoint_in_cpu={cpu} on the {deepspeed.get_accelerator().device_name()} accelerator"
try:
    got = grads(layers, checkpoint=True)
except Exception as e:  # noqa: BLE001 - the raise is what we report
    tb = traceback.extract_tb(e.__traceback__)
    ds = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in tb if "site-packages/deepspeed/" in f.filename]
    print(f"DEFECT: {what}: the backward raised {type(e).__name__}: {e}"
          + (f"\n  raised under {ds[-1]}" if ds else ""))
    sys.exit(1)
same = all(torch.equal(a, b) for a, b in zip(want, got))
print(f"{'OK' if same else 'DEFECT'}: {what}: gradients {'equal' if same else 'differ from'} the plain model's "
      f"({len(want)} params)")
sys.exit(0 if same else 1)
