"""DeepSpeed 0.18.9 and earlier: ZeRO-2 with `offload_optimizer: cpu` and
`gradient_accumulation_steps: 1` keeps only the last backward's gradient when a step has several
engine.backward() calls (engine.set_gradient_accumulation_boundary(False) before all but the last,
True before the last, then one engine.step()). The update silently uses the last chunk alone.

copy_grads_in_partition (deepspeed/runtime/zero/stage_1_and_2.py:1504 in 0.18.9) saves a
backward's reduced gradient into the CPU accumulator (async_accumulate_grad_in_cpu_via_gpu) only
under `if self.gradient_accumulation_steps > 1:` (:1507). With 1, the earlier backwards' gradients
are never stored, and at the boundary async_inplace_copy_grad_to_fp32_buffer_from_gpu (:1515)
overwrites the fp32 gradient with the last chunk's. PR #7981 (first in 0.19.0) gates it on
`self.micro_step_id > 0 or not self.is_gradient_accumulation_boundary` instead. ZeRO-1 is not hit
here: it reduces only at the boundary (reduce_ready_partitions_and_remove_grads, :1615), after the
backwards have summed into param.grad, so `--stage 1` passes on 0.18.9 too.

The data are small integers (bias-free Linear, loss = (out * y).sum(), so d loss / d W = y^T x;
SGD lr 0.5), so the expected parameters, computed in plain torch, compare exactly.

Run (world 1, gloo, CPU; pick the release with PYTHONPATH=<overlay site>):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 300 \
    python -m torch.distributed.run --nproc_per_node 1 06_offload_multi_backward_drops_chunks.py \
    [--backwards 2|3] [--stage 1|2] [--no-offload]
--no-offload (the control) runs the same without offload_optimizer: then it passes.
Exit 1 and "DEFECT: ..." when the update differs from the expected one; exit 0 and "OK: ..." otherwise.
"""
import sys
import torch
import deepspeed


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


n, stage, offload = arg("--backwards", 3), arg("--stage", 2), "--no-offload" not in sys.argv
deepspeed.init_distributed(dist_backend="gloo")
w0 = torch.tensor([[1., 2., 3.], [4., 5., 6.]])
xs = [torch.tensor([[1., 0., 2.]]), torch.tensor([[0., 3., 1.]]), torch.tensor([[2., 1., 0.]])][:n]
ys = [torch.tensor([[1., 2.]]), torch.tensor([[3., -1.]]), torch.tensor([[-2., 1.]])][:n]
expected = w0 - 0.5 * sum(y.T @ x for x, y in zip(xs, ys))  # one SGD step on the summed gradient
last_only = w0 - 0.5 * (ys[-1].T @ xs[-1])

model = torch.nn.Linear(3, 2, bias=False)
with torch.no_grad():
    model.weight.copy_(w0)
zero = {"stage": stage}
if offload:
    zero["offload_optimizer"] = {"device": "cpu"}
config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
          "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "zero_allow_untested_optimizer": True,
          "zero_force_ds_cpu_optimizer": False, "zero_optimization": zero}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for k, (x, y) in enumerate(zip(xs, ys)):
    engine.set_gradient_accumulation_boundary(k == n - 1)
    engine.backward((engine(x) * y).sum())
engine.step()
got = engine.module.weight.detach().float().cpu()
head = (f"DeepSpeed {deepspeed.__version__}, ZeRO-{stage}, offload_optimizer={'cpu' if offload else 'none'}, "
        f"gradient_accumulation_steps 1, {n} backward() calls per step")
detail = (f"  weight[0][0]: got {got[0, 0].item():g}, expected {expected[0, 0].item():g} "
          f"(last chunk only would give {last_only[0, 0].item():g})\n"
          f"  weight: got {got.tolist()}\n  expected {expected.tolist()}")
engine.destroy()
if torch.equal(got, expected):
    print(f"OK: {head}: the step used every backward's gradient\n{detail}")
    sys.exit(0)
which = " (the last backward's alone)" if torch.equal(got, last_only) else ""
print(f"DEFECT: {head}: the step used the wrong gradient{which}\n{detail}")
sys.exit(1)
