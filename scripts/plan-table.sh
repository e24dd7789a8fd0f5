#!/usr/bin/env bash
# docs/plan.md's zerocheck plan table: Llama-2 7B (bf16, AdamW, micro-batch 1 x 4096 tokens) on
# H100s at ZeRO-1/2/3 with and without optimizer offload, at 8, 64 and 1,024 ranks (every rank
# simulated). Prints a Markdown table; set ZC_BIN to another zerocheck binary.
# MODEL=mixtral-8x7b [EP=8]: the MoE preset at ZeRO-1/2 (DeepSpeed refuses MoE at 0 and 3), with
# moe.ep_size EP added to each config. ATTENTION=fused: FlashAttention-style memory.
# CHECKPOINTING=1: Hugging Face's gradient checkpointing (--gradient-checkpointing).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ZC_BIN:-build/default/cli/zerocheck}
attention=${ATTENTION:-materialised}
ckpt=(); [[ -n ${CHECKPOINTING:-} ]] && ckpt=(--gradient-checkpointing)
model=${MODEL:-llama-2-7b}
configs="zero1 zero1-offload zero2 zero2-offload zero3 zero3-offload"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for cfg in $configs; do
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); ep=int(sys.argv[2])
if ep: c['moe']={'ep_size':ep}
json.dump(c,open(sys.argv[3],'w'))" examples/plan/$cfg.json "${EP:-0}" "$tmp/$cfg.json"
done
if [[ $model == mixtral* ]]; then
  configs="zero1 zero1-offload zero2 zero2-offload"
  [[ -n ${EP:-} ]] || { echo "MODEL=$model needs EP=<moe.ep_size>" >&2; exit 2; }
fi
echo "| ZeRO | offload | ranks | GPU peak | params | grads | master | opt. states | buckets + comm | gathered + prefetch | activations | CPU peak | step | blocked in collectives | offload | tokens/s | wall |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for cfg in $configs; do
  for w in 8 64 1024; do
    t0=$(date +%s.%N)
    "$bin" plan --config "$tmp/$cfg.json" --model "$model" --world-size "$w" --attention "$attention" "${ckpt[@]}" \
      --ranks all --no-deepspeed --json > /tmp/zc-plan-$$.json || true
    t1=$(date +%s.%N)
    python3 - "$cfg" "$w" "$t0" "$t1" /tmp/zc-plan-$$.json <<'PY'
import json, sys
cfg, w, t0, t1, f = sys.argv[1:]
d = json.load(open(f))
g = d["memory"]["gpu"]["at_peak"]
gib = lambda b: f"{b / 2**30:.2f}"
c = lambda *k: gib(sum(g.get(x, 0) for x in k))
t = d["time_us"]
stage = d["config"]["stage"]
print(f"| {stage} | {d['config']['offload']} | {w} | {gib(d['memory']['gpu']['peak_bytes'])} GiB | {c('params')} | {c('grads')} | "
      f"{c('master')} | {c('optimizer_states')} | {c('ipg_buckets','comm_buffers')} | {c('gathered_params','prefetch','persistent')} | "
      f"{c('activations','temporaries')} | {gib(d['memory']['cpu']['peak_bytes'])} GiB | {t['step']/1e3:.0f} ms | "
      f"{t['exposed_communication']/1e3:.0f} ms | {t['offload']/1e3:.0f} ms | {d['tokens_per_s']:.0f} | {float(t1)-float(t0):.1f} s |")
PY
  done
done
rm -f /tmp/zc-plan-$$.json
