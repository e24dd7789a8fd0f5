"""DeepSpeed 0.19.8: with ZeRO-1/2 `round_robin_gradients: true` (and no `parameter_alignment`
padding, the default) DeepSpeed's own getters safe_get_full_fp32_param, safe_get_full_grad and
safe_get_full_optimizer_state return another parameter's values, or raise.

The flat buffer holds the params in _round_robin_reorder's order (param i to bin i % world), but
_link_all_hp_params (deepspeed/runtime/zero/stage_1_and_2.py:824) passes link_hp_params the params
in group order and gives it their buffer offsets only `if any(self.round_robin_bit16_padding[i])`
(stage_1_and_2.py:835); without padding link_hp_params lays the params out consecutively in group
order (deepspeed/utils/mixed_precision_linkage.py:40), so each lp -> hp mapping points at the wrong
slice. Training itself is unaffected (the flat partitions step correctly).

Run (world 2, gloo, CPU):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 300 \
    python -m torch.distributed.run --nproc_per_node 2 01_round_robin_hp_mapping.py [--stage 1|2] [--no-round-robin]
Exit 1 and "DEFECT: ..." when a getter disagrees with the truth; exit 0 and "OK: ..." otherwise.
"""
import sys
import torch
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state

SIZES = [3, 9, 5, 7]  # distinct sizes: in round-robin order the buffer is p0, p2, p1, p3


class Params(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(100.0 * k + torch.arange(n, dtype=torch.float32))
                                          for k, n in enumerate(SIZES)])

    def forward(self, x):  # d loss / d p = 2 p x
        return sum((p * p).sum() for p in self.ps) * x.mean()


stage = int(sys.argv[sys.argv.index("--stage") + 1]) if "--stage" in sys.argv else 2
deepspeed.init_distributed(dist_backend="gloo")
model = Params()
truth_params = [p.detach().clone() for p in model.ps]
config = {"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "Adam", "params": {"lr": 0.001, "torch_adam": True}},
          "gradient_clipping": 0.0,
          "zero_optimization": {"stage": stage, "round_robin_gradients": "--no-round-robin" not in sys.argv}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
rank = torch.distributed.get_rank()
loss = engine(torch.ones(1))
engine.backward(loss)
wrong = []


def check(what, i, got, want):
    show = lambda t: "[" + ", ".join(f"{v:g}" for v in t.tolist()) + "]"  # noqa: E731
    if isinstance(got, Exception) or not torch.allclose(got, want):
        wrong.append(f"{what} (p{i}, numel {SIZES[i]}) = {got if isinstance(got, Exception) else show(got)}, "
                     f"expected {show(want)}")


for i, p in enumerate(engine.module.ps):
    check("safe_get_full_fp32_param", i, safe_get_full_fp32_param(p), truth_params[i])
    try:
        got = safe_get_full_grad(p)
    except Exception as e:  # noqa: BLE001 - the raise is what we report
        got = RuntimeError(f"{type(e).__name__}: {e}")
        # It raised on this rank before its all_reduce (tensor_fragment.py:119); join the peer's
        # with zeros, so that the peer's result is its own fragment alone.
        torch.distributed.all_reduce(torch.zeros(p.numel()), group=p._dp_group)
    check("safe_get_full_grad", i, got, 2 * truth_params[i])
engine.step()
for i, p in enumerate(engine.module.ps):  # Adam's first step: exp_avg = (1 - beta1) * grad
    check("safe_get_full_optimizer_state exp_avg", i, safe_get_full_optimizer_state(p, "exp_avg"),
          (1 - 0.9) * (2 * truth_params[i]))
everywhere = [None, None]
torch.distributed.all_gather_object(everywhere, wrong)
wrong = [("both ranks" if w in everywhere[1 - r] else f"rank {r}") + ": " + w  # the getters all-reduce
         for r in (0, 1) for w in everywhere[r] if r == 0 or w not in everywhere[0]]
if rank == 0:
    head = f"ZeRO-{stage}, round_robin_gradients={config['zero_optimization']['round_robin_gradients']}, world 2"
    print("\n".join([f"DEFECT: {head}: {len(wrong)} getter results wrong"] + wrong) if wrong else
          f"OK: {head}: every safe_get_full_* getter returned the param's own values")
engine.destroy()
sys.exit(1 if wrong else 0)
