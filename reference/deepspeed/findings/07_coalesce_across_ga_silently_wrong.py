"""DeepSpeed 0.19.2 through 0.19.8: with gradient_accumulation_steps 2 and one
`with engine.coalesce_grad_reduction():` block per micro-step (engine.step() after each block),
ZeRO-1/2 silently make a different update from the same data without the blocks: the step uses
the last block's gradient alone. (ZeRO-3 passes: it adds to its gradient partitions once
micro_step_id > 0, deepspeed/runtime/zero/stage3.py:2024.)

The docstring of coalesce_grad_reduction (deepspeed/runtime/engine.py:3248-3249 in 0.19.8) says:
"Do not span multiple gradient_accumulation_steps with multiple with-blocks; the flush overwrites
averaged_gradients each exit." Nothing enforces it: the block forces the boundary on exit
(engine.py:3286-3287) and flushes a reduction (_flush_coalesced_reduction_zero12, :3300), whatever
the micro-step. At that forced boundary independent_gradient_partition_epilogue sets
averaged_gradients to the gradient since the last flush (deepspeed/runtime/zero/stage_1_and_2.py:
1046-1047) and clears the accumulator (:1059), so each block's flush replaces the one before, and
engine.step() takes it without an error. DeepSpeed documents the constraint; the defect is that
nothing checks it.

Each micro-step is 2 rows. With blocks, each row gets its own engine.backward() inside the
micro-step's block; without, the micro-step is one engine.backward() over both rows (plain gradient
accumulation). The loss is a sum, so both give the same gradient. The data are small integers
(bias-free Linear, loss = (out * y).sum(), SGD lr 0.5), so the runs and plain torch compare exactly.

Run (world 1, gloo, CPU; pick the release with PYTHONPATH=<overlay site>):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 300 \
    python -m torch.distributed.run --nproc_per_node 1 07_coalesce_across_ga_silently_wrong.py \
    [--stage 1|2|3] [--ga 1|2]
--ga 1 (the control) has one block per optimizer step, as documented: then the runs agree.
Exit 1 and "DEFECT: ..." when the two runs differ; exit 0 and "OK: ..." when they agree.
"""
import sys
import torch
import deepspeed


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


stage, ga, per_block = arg("--stage", 1), arg("--ga", 2), 2  # ga micro-steps of 2 rows each
deepspeed.init_distributed(dist_backend="gloo")
w0 = torch.tensor([[1., 2., 3.], [4., 5., 6.]])
xs = [torch.tensor([[1., 0., 2.]]), torch.tensor([[0., 3., 1.]]), torch.tensor([[2., 1., 0.]]),
      torch.tensor([[1., 1., 1.]])][:ga * per_block]
ys = [torch.tensor([[1., 2.]]), torch.tensor([[3., -1.]]), torch.tensor([[-2., 1.]]),
      torch.tensor([[1., 1.]])][:ga * per_block]
expected = w0 - 0.5 * sum(y.T @ x for x, y in zip(xs, ys)) / ga  # engine.backward scales each loss by 1/ga
last_only = w0 - 0.5 * sum(y.T @ x for x, y in zip(xs[-per_block:], ys[-per_block:])) / ga


def train(coalesce):
    model = torch.nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(w0)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": ga, "gradient_clipping": 0.0,
              "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for m in range(ga):
        x, y = torch.cat(xs[m * per_block:(m + 1) * per_block]), torch.cat(ys[m * per_block:(m + 1) * per_block])
        if coalesce:  # one backward() per row: the loss is a sum, so the gradients add up to the batch's
            with engine.coalesce_grad_reduction():
                for k in range(per_block):
                    engine.backward((engine(x[k:k + 1]) * y[k:k + 1]).sum())
        else:  # the same micro-step as one backward() over the batch, plain gradient accumulation
            engine.backward((engine(x) * y).sum())
        engine.step()
    with deepspeed.zero.GatheredParameters([engine.module.weight], enabled=stage == 3):
        got = engine.module.weight.detach().float().cpu().clone()
    engine.destroy()
    return got


plain, coalesced = train(False), train(True)
head = (f"DeepSpeed {deepspeed.__version__}, ZeRO-{stage}, gradient_accumulation_steps {ga}, "
        f"one coalesce_grad_reduction block of {per_block} backward() calls per micro-step")
detail = (f"  without blocks: {plain.tolist()}\n  with blocks:    {coalesced.tolist()}\n"
          f"  plain torch:    {expected.tolist()}  (last micro-step alone: {last_only.tolist()})")
if torch.equal(plain, coalesced):
    print(f"OK: {head}: the same update as without the blocks\n{detail}")
    sys.exit(0)
print(f"DEFECT: {head}: a different update from the same data without the blocks, and no error\n{detail}")
sys.exit(1)
