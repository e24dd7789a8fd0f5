"""Logs every collective DeepSpeed 0.19.8 stage 3 issues in a plain training loop (CPU, gloo), with its
phase, output bytes and the DeepSpeed frames that issued it, and prints rank 0's all_gather list and
totals. The figures of Zero3.AllGathersAreDeepSpeedsCallForCallOverARun (tests/zero3_test.cpp) come
from it. Run through gather_trace.sh, which starts WORLD processes with RANK/WORLD_SIZE set:
  reference/deepspeed/gather_trace.sh 2 '{"model": "mlp", "dims": [3, 4, 2], "steps": 3}'
Keys: model (mlp | synthetic), dims or shapes, dtype (f32 | bf16), ga, n (forward/backward chunks per
micro-step), steps, coalesce, explicit, eval, offload_param, zero_extra and ds_extra (merged into the
config)."""
import os, sys, json, datetime, traceback
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_lock
build_lock.install()  # a killed rank must not leave torch's extension lock behind (build_lock.py)
import deepspeed
import deepspeed.comm as dist

cfg = json.loads(os.environ["ZCG_CFG"])
torch.set_num_threads(1)
deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank(); W = dist.get_world_size()
import deepspeed.comm.comm as cm
be = cm.cdb
phase = ["pre"]
log = []
depth = [0]
KINDS = {"all_gather_into_tensor": 0, "all_gather_base": 0, "all_gather": 0, "all_gather_coalesced": 0,
         "all_reduce": 0, "all_reduce_coalesced": 0, "reduce_scatter_tensor": 1, "reduce_scatter": 1,
         "broadcast": 0, "barrier": None, "reduce": 0}
NAMES = {0: ("tensor", "output_tensor", "output", "tensors", "output_tensors", "tensor_list"),
         1: ("input_tensor", "input", "input_list", "input_tensor_list")}
def nbytes(a):
    if a is None: return 0
    if isinstance(a, (list, tuple)): return sum(nbytes(x) for x in a)
    return a.numel() * a.element_size() if hasattr(a, "element_size") else 0
def wrap(m, argi, fn):
    def f(*args, **kw):
        outer = depth[0] == 0
        if outer:
            t = None
            if argi is not None:
                t = args[argi] if len(args) > argi else next((kw[n] for n in NAMES[argi] if n in kw), None)
            st = [fr for fr in traceback.extract_stack()[:-1] if "/deepspeed/" in fr.filename and "/comm/" not in fr.filename]
            keys = ("stage3.py", "partitioned_param_coordinator.py", "parameter_offload.py", "engine.py")
            outer = [fr for fr in st if any(fr.filename.endswith(k) for k in keys)]
            site = " < ".join(f"{fr.filename.split('/')[-1]}:{fr.lineno}" for fr in reversed(outer[-3:])) if outer else "?"
            inner = f"{st[-1].filename.split('/deepspeed/')[-1]}:{st[-1].lineno}" if st else "?"
            where = f"{site} -> {inner}"
            log.append({"phase": phase[0], "m": m, "bytes": nbytes(t), "dtype": str(getattr(t, "dtype", "")).replace("torch.", ""), "where": where})
        depth[0] += 1
        try:
            return fn(*args, **kw)
        finally:
            depth[0] -= 1
    return f
for m, a in KINDS.items():
    if hasattr(be, m):
        setattr(be, m, wrap(m, a, getattr(be, m)))

# The reference's own twin models (importing twin also applies its one patch to DeepSpeed, which
# only round_robin_gradients reaches).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from twin import MlpTwin, SyntheticTwin  # noqa: E402

torch.manual_seed(0)
dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[cfg.get("dtype", "f32")]
if cfg["model"] == "mlp":
    dims = cfg["dims"]; model = MlpTwin(dims, len(dims) > 2)
    def batch():
        return {"x": torch.ones(2, dims[0], dtype=dtype), "c": torch.ones(2, dims[-1], dtype=dtype)}
else:
    shapes = cfg["shapes"]; model = SyntheticTwin([(n,) for n in shapes])
    def batch():
        return {f"g{i}": torch.ones(2, n, dtype=dtype) for i, n in enumerate(shapes)}
ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": cfg.get("ga", 1), "gradient_clipping": 0.0,
      "zero_optimization": {"stage": 3, "contiguous_gradients": cfg.get("contiguous", True), "overlap_comm": cfg.get("overlap", False),
                            "reduce_bucket_size": cfg.get("bucket", 1000)},
      "optimizer": {"type": "SGD", "params": {"lr": 0.125}}, "zero_allow_untested_optimizer": True}
ds["zero_optimization"].update(cfg.get("zero_extra", {})); ds.update(cfg.get("ds_extra", {}))
if cfg.get("dtype") == "bf16": ds["bf16"] = {"enabled": True, "check_grad_overflow": False}
if cfg.get("offload_param"): ds["zero_optimization"]["offload_param"] = {"device": "cpu"}
phase[0] = "init"
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
ga, n = cfg.get("ga", 1), cfg.get("n", 1)
for s in range(cfg.get("steps", 2)):
    for m in range(ga):
        def chunks():
            for c in range(n):
                if cfg.get("explicit", False) and not cfg.get("coalesce"):
                    engine.set_gradient_accumulation_boundary(m + 1 == ga and c + 1 == n)
                phase[0] = f"s{s}m{m}c{c}.fwd"
                loss = engine(**batch())
                phase[0] = f"s{s}m{m}c{c}.bwd"
                engine.backward(loss)
        if cfg.get("coalesce"):
            with engine.coalesce_grad_reduction():
                chunks()
        else:
            chunks()
        phase[0] = f"s{s}m{m}.step"
        engine.step()
if cfg.get("eval"):
    engine.eval()
    with torch.no_grad():
        phase[0] = "eval.fwd"
        engine(**batch())
phase[0] = "end"
if rank == 0:
    print("PARAMS", [(nm, p.ds_id, p.ds_numel, p.ds_tensor.ds_numel, bool(p.ds_persist)) for nm, p in engine.module.named_parameters()])
    print("MODULES", [(nm, mm.ds_id) for nm, mm in engine.module.named_modules()])
    for i, e in enumerate(log):
        if e["m"].startswith("all_gather"):
            print(f"AG {e['phase']:14s} {e['bytes']:6d} B {e['dtype']:8s} {e['where']}")
    from collections import Counter
    tot = Counter(); byt = Counter()
    for e in log:
        k = "all_gather" if e["m"].startswith("all_gather") else e["m"]
        tot[k] += 1; byt[k] += e["bytes"]
    print("TOTALS", dict(tot), dict(byt))
    ag = [e for e in log if e["m"].startswith("all_gather")]
    print("AG_SUMMARY calls", len(ag), "bytes", sum(e["bytes"] for e in ag))
dist.barrier()
