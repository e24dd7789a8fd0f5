#!/usr/bin/env python
"""Measure CPU live tensor bytes during one forward+backward of tiny HF Llama / GPT-2
with and without gradient checkpointing.

Method: torch.profiler (CPU, profile_memory=True, record_shapes=True, with_stack=False).
The live-bytes timeline is rebuilt from the raw allocation events of the profiler's
event tree (prof.profiler.kineto_results.experimental_event_tree(); nodes with
tag == _EventType.Allocation carry alloc_size = +bytes / -bytes, ptr, start_time_ns,
total_allocated).  These are exactly the "[memory]" records; the FunctionEvent list
(prof.events()) folds most of them into the enclosing op's cpu_memory_usage and only
leaves un-parented ones as "[memory]" events, so it cannot be used directly for a
timeline.  The tree gives each allocation its enclosing op chain, and module names
are added with record_function ranges opened/closed by forward (pre-)hooks
("mod:<qualified name>").

Run: PYTHONPATH=/tmp/hfck/site python measure.py [--nolabel] [--json out.json]
"""
import argparse
import json
import sys
import warnings
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

B, S = 2, 128
ALLOC = None  # set lazily to the _EventType.Allocation enum value


def make_llama():
    cfg = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, attn_implementation="eager")
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg)


def make_gpt2():
    cfg = GPT2Config(vocab_size=1000, n_embd=256, n_inner=1024, n_layer=4, n_head=4, n_positions=128,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     summary_first_dropout=0.0, attn_implementation="eager")
    cfg._attn_implementation = "eager"
    return GPT2LMHeadModel(cfg)


# ----------------------------------------------------------------- module labels
MODSTACK = ["<top>"]


def add_labels(model):
    stacks = defaultdict(list)
    handles = []
    for name, mod in model.named_modules():
        label = "mod:" + (name or "<root>")

        def pre(m, args, label=label, name=name):
            stacks[id(m)].append(torch.ops.profiler._record_function_enter_new(label, None))
            MODSTACK.append(name or "<root>")

        def post(m, args, out):
            torch.ops.profiler._record_function_exit._RecordFunction(stacks[id(m)].pop())
            MODSTACK.pop()
            return None

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    return handles


# ----------------------------------------------------------------- timeline
def collect(prof):
    """Return (allocs sorted by time, marker ranges).  Each alloc: dict(t, size, ptr, total, ctx)."""
    global ALLOC
    roots = prof.profiler.kineto_results.experimental_event_tree()
    out, markers = [], {}
    stack = [(r, ()) for r in roots]
    seq = 0
    while stack:
        e, ctx = stack.pop()
        tag = str(e.tag)
        if tag.endswith("Allocation"):
            ef = e.extra_fields
            if ef.device.type == "cpu":
                out.append(dict(t=e.start_time_ns, seq=seq, size=ef.alloc_size, ptr=ef.ptr,
                                total=ef.total_allocated, ctx=ctx))
                seq += 1
            continue
        if e.name in ("FWD", "BWD", "DEL"):
            markers[e.name] = (e.start_time_ns, e.end_time_ns)
        nctx = ctx + (e.name,)
        for c in e.children:
            stack.append((c, nctx))
    out.sort(key=lambda a: (a["t"], a["seq"]))
    return out, markers


def describe(ctx):
    mods = [c[4:] for c in ctx if c.startswith("mod:")]
    ops = [c for c in ctx if not c.startswith("mod:") and c not in ("FWD", "BWD", "DEL")]
    # autograd node names (backward) look like "autograd::engine::evaluate_function: MmBackward0"
    nodes = [c.split(": ", 1)[1] for c in ops if c.startswith("autograd::engine::evaluate_function")]
    node = nodes[-1] if nodes else None  # innermost autograd node (inner backward of a reentrant checkpoint)
    top_op = next((c for c in ops if c.startswith("aten::") or c.startswith("CheckpointFunction")), None)
    leaf = ops[-1] if ops else None
    parts = []
    if mods:
        parts.append(mods[-1])
    if node:
        parts.append("bwd:" + node)
    if top_op:
        parts.append(top_op)
    if leaf and leaf != top_op:
        parts.append("leaf:" + leaf)
    return " | ".join(parts) if parts else "<no op>"


def analyse(allocs, markers):
    live = 0
    live_by_ptr = {}
    unmatched_free = 0
    tl = []  # (t, live)
    peak, peak_t, peak_set = -1, None, None
    fwd_end = markers["FWD"][1]
    bwd_end = markers["BWD"][1]
    after_fwd = after_bwd = None
    after_fwd_set = None
    fwd_peak, fwd_peak_set = -1, None
    for idx, a in enumerate(allocs):
        a["idx"] = idx
        if after_fwd is None and a["t"] > fwd_end:
            after_fwd = live
            after_fwd_set = dict(live_by_ptr)
        if after_bwd is None and a["t"] > bwd_end:
            after_bwd = live
        if a["size"] > 0:
            live_by_ptr[a["ptr"]] = a
        else:
            if a["ptr"] in live_by_ptr:
                live_by_ptr[a["ptr"]]["free_idx"] = idx
                del live_by_ptr[a["ptr"]]
            else:
                unmatched_free += 1
        live += a["size"]
        tl.append((a["t"], live))
        if live > peak:
            peak, peak_t, peak_set, peak_alloc = live, a["t"], dict(live_by_ptr), a
        if a["t"] <= fwd_end and live > fwd_peak:
            fwd_peak, fwd_peak_set = live, dict(live_by_ptr)
    if after_fwd is None:
        after_fwd, after_fwd_set = live, dict(live_by_ptr)
    if after_bwd is None:
        after_bwd = live
    phase = "FWD" if peak_t <= fwd_end else ("BWD" if peak_t <= bwd_end else "after")
    # consistency with profiler's own running total (total_allocated)
    tot_delta = (allocs[-1]["total"] - allocs[0]["total"] + allocs[0]["size"]) if allocs else 0
    # attention probabilities allocated during the forward: what was the last allocation before their free?
    probs = []
    for a in allocs:
        if a["size"] > 0 and a["t"] <= fwd_end and "aten::softmax" in a["ctx"] and not any(
                c.startswith("autograd::engine") for c in a["ctx"]):
            fi = a.get("free_idx")
            if fi is None:
                probs.append((describe(a["ctx"]), "not freed in profiled region", None))
                continue
            last = next((b for b in reversed(allocs[a["idx"] + 1:fi]) if b["size"] > 0), None)
            phase_f = "FWD" if allocs[fi]["t"] <= fwd_end else "BWD/after"
            probs.append((describe(a["ctx"]), f"freed in {phase_f}", describe(last["ctx"]) if last else None))
    # per decoder layer: transient during its (first) forward = max live inside the layer - live before it
    layer_fwd = {}
    live2 = 0
    live2_set = {}
    for a in allocs:
        if a["size"] > 0:
            live2_set[a["ptr"]] = a
        else:
            live2_set.pop(a["ptr"], None)
        if a["t"] <= fwd_end:
            mods = [c[4:] for c in a["ctx"] if c.startswith("mod:")]
            li = next((layer_of(m) for m in mods if layer_of(m) is not None), None)
            if li is not None:
                st = layer_fwd.setdefault(li, {"before": live2, "max": live2})
            live2 += a["size"]
            if li is not None:
                if live2 > st["max"]:
                    st["max"] = live2
                    if li == 0:
                        st["max_set"] = {p: b for p, b in live2_set.items() if b["idx"] >= a["idx"] or any(
                            c == "mod:model.layers.0" or c == "mod:transformer.h.0" for c in b["ctx"])}
                st["after"] = live2
    return dict(after_fwd=after_fwd, peak=peak, fwd_peak=fwd_peak, fwd_peak_set=fwd_peak_set, probs=probs,
                layer_fwd=layer_fwd, peak_alloc=peak_alloc, fwd_end=fwd_end, bwd_end=bwd_end, peak_phase=phase, end=live, after_bwd=after_bwd,
                unmatched_free=unmatched_free, n_events=len(allocs), total_allocated_delta=tot_delta,
                peak_set=peak_set, after_fwd_set=after_fwd_set, end_set=dict(live_by_ptr),
                peak_t_rel_us=(peak_t - markers["FWD"][0]) / 1e3,
                fwd_us=(fwd_end - markers["FWD"][0]) / 1e3, bwd_us=(bwd_end - markers["BWD"][0]) / 1e3)


def top_allocs(live_set, k=10):
    items = sorted(live_set.values(), key=lambda a: -a["size"])
    return [(a["size"], describe(a["ctx"])) for a in items[:k]]


def grouped(live_set):
    g = defaultdict(lambda: [0, 0])
    for a in live_set.values():
        d = describe(a["ctx"])
        g[d][0] += a["size"]
        g[d][1] += 1
    return sorted(((v[0], v[1], k) for k, v in g.items()), reverse=True)


def layer_of(modname):
    parts = modname.split(".")
    for i, p in enumerate(parts):
        if p in ("layers", "h") and i + 1 < len(parts) and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


# ----------------------------------------------------------------- one run
def set_ckpt(model, mode):
    if mode in ("none", "none_nocache"):
        return
    if mode == "reentrant":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    elif mode == "default":
        model.gradient_checkpointing_enable()  # transformers default kwargs
    else:
        raise ValueError(mode)


CALL_KW = {}
KEEP_OUTPUT = False


def run_once(model, ids, attribute=False):
    """attribute=True: also record, via a saved_tensors_hooks pack hook active during the forward only,
    which module saved which storage (keyed by storage data_ptr, matched to profiler ptrs)."""
    for p in model.parameters():
        p.grad = None
    savers = defaultdict(set)

    def pack(t):
        savers[t.untyped_storage().data_ptr()].add(MODSTACK[-1])
        return t

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=False) as prof:
        with record_function("FWD"):
            if KEEP_OUTPUT:  # keep the ModelOutput (logits, cache) referenced until after backward
                if attribute:
                    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                        out = model(input_ids=ids, labels=ids, **CALL_KW)
                else:
                    out = model(input_ids=ids, labels=ids, **CALL_KW)
                loss = out.loss
            else:  # the brief's form: only the loss survives the forward
                if attribute:
                    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                        loss = model(input_ids=ids, labels=ids, **CALL_KW).loss
                else:
                    loss = model(input_ids=ids, labels=ids, **CALL_KW).loss
        with record_function("BWD"):
            loss.backward()
        with record_function("DEL"):
            if KEEP_OUTPUT:
                del out
            del loss
    del MODSTACK[1:]  # early-stopped recomputation (non-reentrant) may leave entries
    allocs, markers = collect(prof)
    res = analyse(allocs, markers)
    gradptr = {p.grad.untyped_storage().data_ptr(): n for n, p in model.named_parameters() if p.grad is not None}
    res["gradptr"] = gradptr
    res["grad_bytes"] = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    res["savers"] = dict(savers)
    return res


def mib(x):
    return f"{x / 2**20:.3f}"


def label_alloc(a, r):
    d = describe(a["ctx"])
    if r["end_set"].get(a["ptr"]) is a and a["ptr"] in r["gradptr"]:
        d += "  => becomes .grad of " + r["gradptr"][a["ptr"]]
    return d


def report(mname, mode, reps, attr, nolabel, param_bytes):
    print(f"\n=== {mname} ckpt={mode}  sum of param bytes (= grads) = {param_bytes} ({mib(param_bytes)} MiB)")
    for tag, r in [(f"rep{i}", r) for i, r in enumerate(reps)] + [("nolabel", nolabel), ("attrib", attr)]:
        print(f"  {tag:8s}: after_fwd={r['after_fwd']} ({mib(r['after_fwd'])} MiB)  peak={r['peak']} "
              f"({mib(r['peak'])} MiB, in {r['peak_phase']})  after_bwd(loss{'/out' if KEEP_OUTPUT else ''} still referenced)={r['after_bwd']}  "
              f"end={r['end']} ({mib(r['end'])} MiB; .grad bytes={r['grad_bytes']})  events={r['n_events']} "
              f"unmatched_frees={r['unmatched_free']} total_allocated_delta={r['total_allocated_delta']}")
    r = reps[0]
    print(f"  forward-phase peak (rep0) = {r['fwd_peak']} ({mib(r['fwd_peak'])} MiB); after_fwd = {r['after_fwd']}; "
          f"transient above after_fwd = {r['fwd_peak'] - r['after_fwd']}")
    if mode not in ("none", "none_nocache"):
        print("  live at forward-phase peak, grouped by allocating site:")
        for sz, n, d in grouped(r["fwd_peak_set"]):
            print(f"    {sz:>9} x{n:<3} {d}")
    print("  attention probabilities (softmax outputs) allocated in the forward: when freed / last allocation "
          "before the free:")
    for d, f, last in r["probs"]:
        print(f"    {d}: {f}; last alloc before free: {last}")
    lf = r["layer_fwd"]
    if lf:
        print("  per decoder layer, during its forward: live before -> max inside (transient) -> live after its last event:")
        for li in sorted(lf):
            st = lf[li]
            print(f"    layer {li}: {st['before']} -> {st['max']} (+{st['max'] - st['before']}) -> {st.get('after')} "
                  f"(net +{st.get('after', 0) - st['before']})")
    if 0 in lf and "max_set" in lf[0]:
        print("  layer 0 forward, allocations made inside layer 0 that are live at its in-layer max:")
        for sz, n, d in grouped(lf[0]["max_set"]):
            print(f"    {sz:>9} x{n:<3} {d}")
    pa = r["peak_alloc"]
    print(f"  peak reached at allocation: {pa['size']} by {describe(pa['ctx'])}")
    pk = r["peak_set"]
    cat = defaultdict(int)
    for a in pk.values():
        if r["end_set"].get(a["ptr"]) is a:
            cat["param grads (survive to end)"] += a["size"]
        elif a["t"] <= r["fwd_end"]:
            cat["allocated in forward (saved/held activations, logits...)"] += a["size"]
        elif any(c.startswith("mod:") for c in a["ctx"]):
            cat["recomputed forward activations (allocated in backward inside a module forward)"] += a["size"]
        else:
            cat["other backward buffers (activation grads, temporaries)"] += a["size"]
    print("  peak composition:")
    for k_, v_ in cat.items():
        print(f"    {v_:>9}  {k_}")
    grads_at_peak = sum(a["size"] for a in pk.values() if r["end_set"].get(a["ptr"]) is a)
    print(f"  at peak: {len(pk)} live allocations; {grads_at_peak} bytes of them are param grads that survive "
          f"to the end; non-grad live = {r['peak'] - grads_at_peak}")
    print("  largest live allocations at peak (rep0):")
    for a in sorted(pk.values(), key=lambda a: -a["size"])[:12]:
        print(f"    {a['size']:>9}  {label_alloc(a, r)}")
    print("  live at peak grouped by allocating site (rep0):")
    for sz, n, d in grouped({p: a for p, a in pk.items() if r["end_set"].get(p) is not a})[:25]:
        print(f"    {sz:>9} x{n:<3} {d}")
    print("  live after forward, by allocating site and by saver (attrib rep; savers = modules whose autograd "
          "nodes saved that storage; '-' = not saved by autograd):")
    rows = defaultdict(lambda: [0, 0])
    for p, a in attr["after_fwd_set"].items():
        sv = attr["savers"].get(p)
        key = (describe(a["ctx"]), ",".join(sorted(sv)) if sv else "-")
        rows[key][0] += a["size"]
        rows[key][1] += 1
    for (d, sv), (sz, n) in sorted(rows.items(), key=lambda x: (-x[1][0], x[0])):
        print(f"    {sz:>9} x{n:<3} {d}   saved-by: {sv}")


def classify_after_fwd(attr):
    """Split the live-after-forward allocations of a non-checkpointed run into those that belong to the
    decoder layers (allocated inside a layer, or saved only by decoder layers) and the rest."""
    layer_b, other_b, other_items = 0, 0, []
    for p, a in attr["after_fwd_set"].items():
        sv = attr["savers"].get(p, set())
        mods = [c[4:] for c in a["ctx"] if c.startswith("mod:")]
        alloc_in_layer = any(layer_of(m) is not None for m in mods)
        saved_outside = any(layer_of(m) is None for m in sv)
        saved_in_layer = any(layer_of(m) is not None for m in sv)
        if saved_outside:
            other_b += a["size"]; other_items.append((a["size"], describe(a["ctx"]), ",".join(sorted(sv))))
        elif saved_in_layer or alloc_in_layer:
            layer_b += a["size"]
        else:
            other_b += a["size"]; other_items.append((a["size"], describe(a["ctx"]), "-"))
    return layer_b, other_b, other_items


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep-output", action="store_true",
                    help="keep the model output object (logits, KV cache) referenced until after backward")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--models", default="llama,gpt2")
    ap.add_argument("--modes", default="none,none_nocache,reentrant,default")
    args = ap.parse_args()
    global KEEP_OUTPUT
    KEEP_OUTPUT = args.keep_output
    torch.manual_seed(0)
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}  transformers {transformers.__version__}  threads {torch.get_num_threads()}")
    print(f"keep_output={KEEP_OUTPUT}; B={B} S={S}; ids allocated before profiling (not in the timeline); all figures are bytes relative "
          f"to the start of the profiled region (just before the forward), params' .grad set to None first")
    results = {}
    for mname in args.models.split(","):
        for mode in args.modes.split(","):
            torch.manual_seed(0)
            model = make_llama() if mname == "llama" else make_gpt2()
            model.train()
            set_ckpt(model, mode)
            if mode not in ("none", "none_nocache"):
                lay = model.model.layers[0] if mname == "llama" else model.transformer.h[0]
                f = lay._gradient_checkpointing_func
                print(f"[{mname}/{mode}] layer0.gradient_checkpointing={lay.gradient_checkpointing} "
                      f"checkpoint kwargs={getattr(f, 'keywords', None)}")
            CALL_KW.clear()
            if mode == "none_nocache":
                CALL_KW["use_cache"] = False
            param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            ids = torch.randint(0, 1000, (B, S), generator=torch.Generator().manual_seed(1))
            nolabel = run_once(model, ids)
            handles = add_labels(model)
            reps = [run_once(model, ids) for _ in range(args.reps)]
            attr = run_once(model, ids, attribute=True)
            for h in handles:
                h.remove()
            results[(mname, mode)] = dict(reps=reps, attr=attr, nolabel=nolabel)
            report(mname, mode, reps, attr, nolabel, param_bytes)

    print("\n=== expected after-forward for the checkpointed runs")
    layer_in = B * S * 256 * 4
    for mname, base in [(m, b) for m in args.models.split(",") for b in ("none", "none_nocache")]:
        if (mname, base) not in results:
            continue
        attr = results[(mname, base)]["attr"]
        layer_b, other_b, items = classify_after_fwd(attr)
        exp = 4 * layer_in + other_b
        print(f"[{mname}] basis {base}: non-ckpt after_fwd={attr['after_fwd']} = decoder-layer part {layer_b} + rest {other_b}")
        print(f"  rest (kept by embedding/final norm/lm_head/loss or held by the output object):")
        for sz, d, sv in sorted(items, reverse=True):
            print(f"    {sz:>9}  {d}   saved-by: {sv}")
        print(f"  expected ckpt after_fwd = 4 x {layer_in} (layer inputs) + {other_b} = {exp} ({mib(exp)} MiB)")
        for mode in ("reentrant", "default"):
            if (mname, mode) in results:
                m = [r["after_fwd"] for r in results[(mname, mode)]["reps"]]
                print(f"  measured {mode}: {m}  measured - expected = {[x - exp for x in m]}")
    if args.json:
        js = {f"{k[0]}/{k[1]}": [{kk: vv for kk, vv in r.items() if kk in (
            "after_fwd", "fwd_peak", "peak", "peak_phase", "end", "after_bwd", "grad_bytes", "n_events", "unmatched_free")}
            for r in v["reps"] + [v["nolabel"], v["attr"]]] for k, v in results.items()}
        json.dump(js, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
