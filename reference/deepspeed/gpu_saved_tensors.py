"""What a Hugging Face model of a zerocheck plan shape saves for backward, by module, on a GPU.

The activations half of gpu_memory.py's measurement, taken apart: one forward of the model that
`--model-json` describes (built as gpu_memory.py builds it, bf16, eager attention, eval mode), under
torch.autograd.graph.saved_tensors_hooks, which sees every tensor autograd keeps for backward. Each
saved tensor is attributed to the innermost module running when it was saved (forward pre/post
hooks keep the stack), and counted once per storage (a tensor saved by two ops, or a view of
another, is one allocation). Prints one JSON object: bytes by module class, by module of layer 0
(its module, shape and dtype), and what is saved outside the blocks (embeddings,
final norm, head, loss), beside torch.cuda.memory_allocated() after the forward.

    python3 gpu_saved_tensors.py --model-json SHAPE.json [--micro-batch N]
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_memory import build_model  # noqa: E402  (the same model as the memory measurement)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-json", required=True)
    ap.add_argument("--micro-batch", type=int, default=1)
    a = ap.parse_args()
    import torch

    shape = json.load(open(a.model_json))
    torch.manual_seed(0)
    model = build_model(shape).to(torch.bfloat16).cuda()
    model.eval()
    stack = ["(top)"]
    names = {m: n for n, m in model.named_modules()}

    def pre(mod, *_):
        stack.append(names.get(mod, "?"))

    def post(mod, *_):
        stack.pop()

    for m in model.modules():
        m.register_forward_pre_hook(pre)
        m.register_forward_hook(post)
    seen = {}  # storage pointer -> (module, bytes, shape, dtype)

    def pack(t):
        if t.is_cuda:
            seen.setdefault(t.untyped_storage().data_ptr(),
                            (stack[-1], t.untyped_storage().nbytes(), list(t.shape), str(t.dtype)))
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, shape["vocab"], (a.micro_batch, shape["seq"]), device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    torch.cuda.synchronize()
    live = torch.cuda.memory_allocated() - base
    by_class, layer0, outside, total = collections.Counter(), [], collections.Counter(), 0
    modules = {n: m for m, n in names.items()}
    block = "transformer.h.0." if "transformer.h.0" in modules else "model.layers.0."
    for ptr, (mod, nbytes, shp, dt) in seen.items():
        if ptr in params:
            continue  # a weight saved for backward is the param itself, not an activation
        total += nbytes
        owner = modules.get(mod)
        by_class[type(owner).__name__ if owner is not None else mod] += nbytes
        if mod.startswith(block) or mod == block[:-1]:
            layer0.append({"module": mod[len(block):] or "(block)", "bytes": nbytes, "shape": shp, "dtype": dt})
        elif ".h." not in mod and ".layers." not in mod:
            outside[mod] += nbytes
    print("SAVED " + json.dumps({
        "model": shape.get("name"), "micro_batch": a.micro_batch, "seq": shape["seq"],
        "saved_unique_bytes": total, "live_after_forward_bytes": live,
        "by_module_class": dict(by_class.most_common()),
        "layer0": sorted(layer0, key=lambda r: -r["bytes"]),
        "outside_blocks": dict(outside.most_common()),
        "loss": float(loss.detach())}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
