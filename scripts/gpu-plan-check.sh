#!/usr/bin/env bash
# zerocheck plan's GPU memory against DeepSpeed's own, measured on a real GPU: for each shape in
# examples/plan/shapes/, each ZeRO stage 0-3 (examples/plan/zero{1,2,3}.json, stage 0 = zero1's
# settings at stage 0), each micro-batch in MICRO_BATCHES (default "1 4") and each of CHECKPOINTING
# (default "off on": Hugging Face's gradient checkpointing, --gradient-checkpointing), DeepSpeed 0.19.8
# trains the Hugging Face model of that shape for 2 steps on one GPU
# (reference/deepspeed/gpu_memory.py: torch's max_memory_allocated), and zerocheck plan predicts
# the same run; the table puts the two side by side.
#
#   scripts/gpu-plan-check.sh --pack           here: DeepSpeed from the pinned environment and the
#                                              wheels it needs beyond the GPU machine's image -> .dsgpu/
#   scripts/gpu-plan-check.sh --measure OUT    on the GPU machine -> OUT/ds_gpu_memory.jsonl, OUT/ds_gpu_memory.log
#   scripts/gpu-plan-check.sh --compare FILE [--json]
#                                              here: zerocheck plan for each measured row; prints the table,
#                                              or one JSON object per row (DeepSpeed's figures and the plan's)
#
# Three steps because the GPU machine of this workplace has torch and transformers but no
# DeepSpeed and no network; elsewhere, a machine with DeepSpeed installed runs --measure directly.
set -euo pipefail
cd "$(dirname "$0")/.."
shapes=(examples/plan/shapes/gpt2-medium.json examples/plan/shapes/llama-1b.json)

stage_config() {  # stage_config STAGE DIR: the ds_config for that stage, written into DIR
  local stage="$1" dir="$2" src="examples/plan/zero$1.json"
  [ "$stage" = 0 ] && src=examples/plan/zero1.json
  python3 - "$src" "$stage" "$dir/zero$stage.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"]["stage"] = int(sys.argv[2])
# DeepSpeed's torch path for Adam, as gpu_memory.py runs it (at stage 0 this makes DeepSpeed's
# wrapper FP16_UnfusedOptimizer, per-tensor fp32 copies, which the plan must be told too).
c.setdefault("optimizer", {"type": "AdamW", "params": {}}).setdefault("params", {})["torch_adam"] = True
json.dump(c, open(sys.argv[3], "w"), indent=1)
PY
  echo "$dir/zero$stage.json"
}

case "${1:-}" in
  --pack)
    env_sp=$(ls -d "${ZC_DS_ENV:-$HOME/.cache/zerocheck/ds-env}"/lib/python3*/site-packages)
    rm -rf .dsgpu && mkdir -p .dsgpu/site .dsgpu/whl
    cp -r "$env_sp/deepspeed" "$env_sp"/deepspeed-*.dist-info .dsgpu/site/
    find .dsgpu/site -name __pycache__ -prune -exec rm -rf {} +
    # pydantic and hjson: DeepSpeed's needs that the GPU machine's image lacks (python 3.12 there).
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .dsgpu/whl \
      pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 hjson==3.1.0
    grep -qx '/.dsgpu/' .git/info/exclude 2>/dev/null || echo '/.dsgpu/' >> .git/info/exclude
    echo "gpu-plan-check: packed $(du -sh .dsgpu | cut -f1) into .dsgpu (carry it to the GPU machine)"
    ;;
  --measure)
    out="${2:?--measure OUT}"
    mkdir -p "$out"
    if [ -d .dsgpu/whl ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/zc-dsgpu-site .dsgpu/whl/*.whl
      export PYTHONPATH="/tmp/zc-dsgpu-site:$PWD/.dsgpu/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    tmp=$(mktemp -d)
    # One wave per (micro-batch, shape): its four stages at once, one process each (torch's
    # allocator figures are per process; four of the largest fit the GPU's memory together).
    : > "$out/ds_gpu_memory.jsonl"; : > "$out/ds_gpu_memory.log"
    i=0
    for ckpt in ${CHECKPOINTING:-off on}; do
    ckpt_flag=(); [ "$ckpt" = on ] && ckpt_flag=(--gradient-checkpointing)
    for mb in ${MICRO_BATCHES:-1 4}; do
      for shape in "${shapes[@]}"; do
        pids=(); first=$i
        for stage in 0 1 2 3; do
          cfg=$(stage_config "$stage" "$tmp")
          MASTER_PORT=$((29600 + i)) PYTHONUNBUFFERED=1 timeout 240 python3 reference/deepspeed/gpu_memory.py \
            --model-json "$shape" --config "$cfg" --steps 2 --micro-batch "$mb" "${ckpt_flag[@]}" \
            >"$tmp/run$i.out" 2>"$tmp/run$i.err" &
          pids+=($!); i=$((i + 1))
        done
        for stage in 0 1 2 3; do
          j=$((first + stage)); rc=0; wait "${pids[$stage]}" || rc=$?
          what="$shape stage $stage micro-batch $mb checkpointing $ckpt"
          { echo "=== $what (exit $rc)"; cat "$tmp/run$j.err"; } >> "$out/ds_gpu_memory.log"
          if line=$(grep '^GPU_MEMORY ' "$tmp/run$j.out"); then
            echo "${line#GPU_MEMORY }" >> "$out/ds_gpu_memory.jsonl"
            echo "gpu-plan-check: $what: measured"
          else
            printf '{"shape": "%s", "stage": %s, "micro_batch": %s, "gradient_checkpointing": %s, "error": "exit %s, see ds_gpu_memory.log"}\n' \
              "$shape" "$stage" "$mb" "$([ "$ckpt" = on ] && echo true || echo false)" "$rc" >> "$out/ds_gpu_memory.jsonl"
            echo "gpu-plan-check: $what: FAILED (exit $rc): $(tail -1 "$tmp/run$j.err")"
          fi
        done
      done
    done
    done
    ;;
  --compare)
    file="${2:?--compare FILE}"
    as_json="${3:-}"
    zc="${ZEROCHECK:-build/default/cli/zerocheck}"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    for s in 0 1 2 3; do stage_config "$s" "$tmp" >/dev/null; done
    python3 - "$file" "$zc" "$tmp" "$as_json" "${shapes[@]}" <<'PY'
import json, subprocess, sys
file, zc, tmp, as_json, shapes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "--json", sys.argv[5:]
by_name = {json.load(open(s)).get("name"): s for s in shapes}
gib = lambda b: f"{b / 2**30:.2f}"


def plan(m):  # zerocheck plan's GPU memory for a measured run's shape, stage and micro-batch
    out = subprocess.run([zc, "plan", "--config", f"{tmp}/zero{m['stage']}.json", "--model-json", by_name[m["model"]],
                          "--world-size", "1", "--gpu", "h200", "--micro-batch", str(m["micro_batch"]),
                          "--no-deepspeed", "--json"] + (["--gradient-checkpointing"] if m.get("gradient_checkpointing") else []),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"gpu-plan-check: zerocheck plan exited {out.returncode} for {m['model']} ZeRO-{m['stage']}: "
                         f"{out.stderr.strip()}")
    return json.loads(out.stdout)["memory"]["gpu"]


if as_json:
    for line in open(file):
        m = json.loads(line)
        print(json.dumps({"measured": m, "plan": None if "error" in m else plan(m)}))
    sys.exit(0)
close = lambda p, d: abs(p - d) <= max(1 << 20, d // 1000)  # 0.1 %, at least 1 MiB
print("| model | stage | micro-batch | checkpointing | construction peak: DeepSpeed / plan (GiB) | ratio | step peak: DeepSpeed / plan (GiB) | ratio | "
      "steps within 0.1 %: after forward, after step, peak | params, master, optimizer states at the end: DeepSpeed / plan (GiB) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for line in open(file):
    m = json.loads(line)
    if "error" in m:
        print(f"| {m['shape']} | {m['stage']} | {m.get('micro_batch', '')} | {'on' if m.get('gradient_checkpointing') else 'off'} | "
              f"not measured: {m['error']} | | | | | |")
        continue
    p = plan(m)
    ds_step = max(s["peak_bytes"] for s in m["steps"])
    st, cp = m["model_states_at_end"], p["category_peaks"]
    states = " / ".join([", ".join(gib(st[k]) for k in ("params", "master", "optimizer_states")),
                         ", ".join(gib(cp.get(k, 0)) for k in ("params", "master", "optimizer_states"))])
    pairs = list(zip(m["steps"], p.get("steps", [])))
    within = ", ".join(f"{sum(close(b[k], a[k]) for a, b in pairs)}/{len(m['steps'])}"
                       for k in ("after_forward_bytes", "after_step_bytes", "peak_bytes"))
    print(f"| {m['model']} | {m['stage']} | {m['micro_batch']} | {'on' if m.get('gradient_checkpointing') else 'off'} | {gib(m['construction_peak_bytes'])} / {gib(p['construction_peak_bytes'])} | "
          f"{p['construction_peak_bytes'] / m['construction_peak_bytes']:.2f} | {gib(ds_step)} / {gib(p['peak_bytes'])} | "
          f"{p['peak_bytes'] / ds_step:.2f} | {within} | {states} |")
first = json.loads(open(file).readline())
print(f"\nDeepSpeed {first.get('deepspeed')} on torch {first.get('torch')}, {first.get('gpu')}; seq "
      f"{first.get('seq')}, bf16, 2 steps; ratio = plan / DeepSpeed; step figures as torch reads them "
      f"(reset_peak_memory_stats before each step).")
PY
    ;;
  *) echo "gpu-plan-check: use --pack, --measure OUT or --compare FILE [--json]" >&2; exit 2 ;;
esac
