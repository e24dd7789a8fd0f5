"""DeepSpeed's GPU memory for one zerocheck plan shape, measured on a real GPU.

Builds the Hugging Face model that a `zerocheck plan --model-json` shape describes (GPT-2 for
learned positions + LayerNorm + GELU, Llama for rotary + RMSNorm + SwiGLU; eager attention, as
zerocheck's materialised attention), hands it to deepspeed.initialize with the given ds_config on
one GPU, runs training steps on random tokens, and prints one JSON object: torch's allocator
figures (torch.cuda.max_memory_allocated / memory_allocated, bytes of live tensors, the same
measure zerocheck plan predicts) for construction and for each step, and the model states by
identity at the end (module params, the optimizer's fp32 master params and its state tensors).

    python3 gpu_memory.py --model-json SHAPE.json --config ds_config.json [--steps 2] [--seed 0] [--micro-batch N]
                          [--gradient-checkpointing] [--trace-construction OUT.json]

Not the reference worker: it runs outside the pinned environment, on the GPU machine's own torch
(scripts/gpu-plan-check.sh carries DeepSpeed and its pure-Python needs there). The optimizer is
DeepSpeed's torch path with torch's fused AdamW ("torch_adam": true, "fused": true) instead of
DeepSpeed's FusedAdam, whose JIT build needs nvcc on the GPU machine; both update in place with
no per-tensor temporaries. The model runs in eval mode: dropout off (zerocheck models none), the
gradients the same. With --gradient-checkpointing it runs in train mode instead (Hugging Face
checkpoints only while training) with every dropout probability 0, which torch's dropout returns
as its input, no copy: model.gradient_checkpointing_enable() with use_reentrant=True (the
Trainer's --gradient_checkpointing under transformers 4.x; 5.x defaults to False).
"""
import argparse
import json
import os
import sys


def build_model(shape):
    import transformers

    family_gpt2 = shape.get("positions") == "learned" and shape.get("norm") == "layernorm" and shape.get("mlp") == "gelu"
    family_llama = shape.get("positions", "rotary") == "rotary" and shape.get("norm", "rmsnorm") == "rmsnorm" and shape.get("mlp", "swiglu") == "swiglu"
    if shape.get("experts", 0):
        raise SystemExit("gpu_memory.py: MoE shapes are not built here (DeepSpeed's MoE layer is a separate model)")
    if family_gpt2:
        if not shape.get("bias", False):
            raise SystemExit("gpu_memory.py: a GPT-2 shape has biased linears; set \"bias\": true")
        cfg = transformers.GPT2Config(
            vocab_size=shape["vocab"], n_positions=shape.get("max_positions", shape["seq"]), n_embd=shape["dim"],
            n_layer=shape["layers"], n_head=shape["heads"], n_inner=shape["ffn"], activation_function="gelu_new",
            layer_norm_epsilon=shape.get("eps", 1e-5), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            tie_word_embeddings=shape.get("tied_embeddings", False), use_cache=False)
        cfg._attn_implementation = "eager"
        return transformers.GPT2LMHeadModel(cfg)
    if family_llama:
        cfg = transformers.LlamaConfig(
            vocab_size=shape["vocab"], hidden_size=shape["dim"], intermediate_size=shape["ffn"],
            num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
            num_key_value_heads=shape.get("kv_heads", shape["heads"]), rms_norm_eps=shape.get("eps", 1e-5),
            rope_theta=shape.get("rope_base", 10000.0), max_position_embeddings=shape["seq"],
            tie_word_embeddings=shape.get("tied_embeddings", False), attention_bias=shape.get("bias", False),
            mlp_bias=shape.get("bias", False), use_cache=False)
        cfg._attn_implementation = "eager"
        return transformers.LlamaForCausalLM(cfg)
    raise SystemExit(f"gpu_memory.py: shape {shape.get('name', '?')} is neither GPT-2-like (learned, layernorm, gelu) "
                     "nor Llama-like (rotary, rmsnorm, swiglu)")


def tensor_bytes(t):
    return t.numel() * t.element_size()


def model_states(engine, model):
    import torch

    seen, params = set(), 0
    for p in model.parameters():
        t = getattr(p, "ds_tensor", None)  # a ZeRO-3 partition; the module's own tensor is empty
        t = t if t is not None else p.data
        if t.is_cuda and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            params += t.untyped_storage().nbytes()
    wrapper = inner = engine.optimizer
    while hasattr(inner, "optimizer") and not isinstance(inner, torch.optim.Optimizer):
        inner = inner.optimizer
    # The fp32 master partitions under each wrapper's own name (ZeRO-3 swaps its flat partitions
    # into the torch optimizer's param_groups only while it steps).
    for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups", "fp32_groups_flat_partition"):
        if getattr(wrapper, name, None) is not None:
            masters = [t for t in getattr(wrapper, name) if torch.is_tensor(t)]
            break
    else:
        masters = [p for g in inner.param_groups for p in g["params"]]
    master = sum(tensor_bytes(t) for t in masters if t.is_cuda)
    states = sum(tensor_bytes(v) for s in inner.state.values() for v in s.values()
                 if torch.is_tensor(v) and v.is_cuda and v.dim() > 0)
    return {"params": params, "master": master, "optimizer_states": states}


def write_peak_composition(torch, path):
    """Replays the allocator's recorded events (torch.cuda.memory._snapshot) to the moment live
    bytes peaked, and writes what was live then: each block's size and the innermost frames of
    DeepSpeed, transformers or this script that allocated it."""
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = snap["device_traces"][0]
    live, cur, peak, at_peak = {}, 0, 0, {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            cur += e["size"]
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif e["action"] == "free_completed" and e["addr"] in live:
            cur -= live.pop(e["addr"])["size"]

    def where(e):
        frames = [f for f in e.get("frames", []) if any(k in f["filename"] for k in ("deepspeed", "transformers", "gpu_memory"))]
        return [f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in frames[:4]]

    blocks = sorted(({"bytes": e["size"], "where": where(e)} for e in at_peak.values()), key=lambda b: -b["bytes"])
    json.dump({"peak_bytes": peak, "events": len(events), "live_at_peak": blocks[:40]}, open(path, "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-json", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-batch", type=int, default=None, help="overrides train_micro_batch_size_per_gpu")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="model.gradient_checkpointing_enable(), in train mode with dropout 0")
    ap.add_argument("--trace-construction", default=None,
                    help="write construction's peak, allocation by allocation with its Python stack, to this JSON")
    a = ap.parse_args()
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29511"}.items():
        os.environ.setdefault(k, v)
    import torch
    import deepspeed

    shape = json.load(open(a.model_json))
    cfg = json.load(open(a.config))
    opt = cfg.setdefault("optimizer", {"type": "AdamW", "params": {}})
    opt.setdefault("params", {}).update({"torch_adam": True, "fused": True})
    if a.micro_batch is not None:
        cfg["train_micro_batch_size_per_gpu"] = a.micro_batch
        cfg.pop("train_batch_size", None)
    mb = cfg.get("train_micro_batch_size_per_gpu", 1)
    torch.manual_seed(a.seed)
    model = build_model(shape)
    if a.gradient_checkpointing:
        # Reentrant, as zerocheck models it: transformers 4.x's default; 5.x defaults to False.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.train()  # Hugging Face checkpoints only in training; every dropout p is 0
    else:
        model.eval()  # dropout off; autograd unchanged
    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    if a.trace_construction:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=1000000)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    torch.cuda.synchronize()
    if a.trace_construction:
        write_peak_composition(torch, a.trace_construction)
    out = {"model": shape.get("name", "custom"), "stage": cfg.get("zero_optimization", {}).get("stage", 0),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "deepspeed": deepspeed.__version__,
           "micro_batch": mb, "seq": shape["seq"], "gradient_checkpointing": a.gradient_checkpointing,
           "before_bytes": before,
           "construction_peak_bytes": torch.cuda.max_memory_allocated(),
           "after_construction_bytes": torch.cuda.memory_allocated(), "steps": []}
    gen = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    for s in range(a.steps):
        ids = torch.randint(0, shape["vocab"], (mb, shape["seq"]), generator=gen).to(engine.device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        loss = engine(input_ids=ids, labels=ids).loss
        after_forward = torch.cuda.memory_allocated()
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        out["steps"].append({"peak_bytes": torch.cuda.max_memory_allocated(), "after_forward_bytes": after_forward,
                             "after_step_bytes": torch.cuda.memory_allocated(), "loss": float(loss.detach())})
        del ids, loss
    out["model_states_at_end"] = model_states(engine, model)
    print("GPU_MEMORY " + json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
