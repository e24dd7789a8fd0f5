"""DeepSpeed 0.19.8: a second AutoSP compile in one process raises
`OSError: could not get source code`.

Every engine.compile() with `compile: {deepcompile: true, passes: [autosp]}` at ZeRO-0/1 calls
init_autosp, which calls register_long_context_checkpointing (deepspeed/compile/init_sp.py:17). That
reads inspect.getsource(torch._functorch.partitioners.solve_min_cut)
(deepspeed/compile/passes/long_context_checkpointing.py:92) and exec()s an edited copy over it
(:103). The copy has no source file, so the next engine's compile fails at that getsource.

Run (world 2 = sequence_parallel_size, gloo, CPU; as tests/unit/v1/compile/test_compile_autosp.py):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 300 \
    python -m torch.distributed.run --nproc_per_node 2 02_autosp_second_compile.py [--restore]
--restore puts torch's solve_min_cut back between the engines (the workaround): then it passes.
Exit 1 and "DEFECT: ..." when the second engine fails; exit 0 and "OK: ..." when both train.
"""
import sys
import traceback
import torch
import torch.nn.functional as F
import deepspeed
from deepspeed.compile import constants
from torch._functorch import partitioners


class TinyAttentionLM(torch.nn.Module):  # the smallest graph AutoSP shards: ids -> SDPA -> loss
    def __init__(self, vocab=32, dim=16, head_dim=8):
        super().__init__()
        self.head_dim, self.embed = head_dim, torch.nn.Embedding(vocab, dim)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, labels, position_ids=None):
        x = self.embed(input_ids)
        b, s = x.shape[:2]
        h = lambda t: t.view(b, s, -1, self.head_dim).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(h(self.q(x)), h(self.k(x)), h(self.v(x)), is_causal=True)
        logits = self.head(self.o(a.transpose(1, 2).reshape(b, s, -1)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def train_one_step(n):
    torch.manual_seed(0)
    model = TinyAttentionLM()
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
              "sequence_parallel_size": torch.distributed.get_world_size(),
              "compile": {"deepcompile": True, "passes": ["autosp"]}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    try:
        engine.compile(backend="inductor", compile_kwargs={"dynamic": True})
        ids, labels = torch.randint(0, 32, (1, 8)), torch.randint(0, 32, (1, 8))
        pos = torch.arange(8).unsqueeze(0)
        ids.tag, labels.tag = constants.AUTOSP_INPUT_ID_KEY, constants.AUTOSP_LABEL_ID_KEY
        pos.tag = constants.AUTOSP_POSITION_ID_KEY
        loss = engine(input_ids=ids, labels=labels, position_ids=pos)
        engine.backward(loss)
        engine.step()
        return f"engine {n}: compile + one step, loss {float(loss.detach()):.4f}"
    finally:
        engine.destroy()
        torch._dynamo.reset()


deepspeed.init_distributed(dist_backend="gloo")
rank0 = torch.distributed.get_rank() == 0
original = partitioners.solve_min_cut
print(train_one_step(1)) if rank0 else train_one_step(1)
if "--restore" in sys.argv:
    partitioners.solve_min_cut = original
try:
    line, status = f"OK: {train_one_step(2)}", 0
except OSError as e:
    tb = traceback.extract_tb(e.__traceback__)
    ds = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in tb if "/deepspeed/" in f.filename]
    line, status = f"DEFECT: engine 2: {type(e).__name__}: {e}\n  raised under {ds[-1]}", 1
torch.distributed.barrier()
print(line) if rank0 else None
sys.exit(status)
