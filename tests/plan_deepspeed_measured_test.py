"""zerocheck plan against DeepSpeed 0.19.8's GPU memory as measured on an NVIDIA H200
(reference/deepspeed/measured/h200-deepspeed-0.19.8.jsonl, written by
`scripts/gpu-plan-check.sh --measure`; docs/plan.md#against-deepspeed-measured-on-a-gpu).

For every measured run (GPT-2 medium and a 0.85B Llama, ZeRO-0 to 3, micro-batch 1 and 4):
  - the plan's params, fp32 master and optimizer-state peaks equal DeepSpeed's tensors, byte for byte;
  - the plan's construction peak is DeepSpeed's within 0.1 % (at least 1 MiB): torch's caching
    allocator counts whole blocks, and hands a large request a block up to 1 MiB bigger when the
    rest is too small to split, so max_memory_allocated runs a few MiB over the bytes asked for
    (Llama at ZeRO-0: 4.27 MB over the plan, while the allocator's own trace, replayed with the
    requested sizes, is 1.1 KB from it: reference/deepspeed/gpu_memory.py --trace-construction).
The configs carry "torch_adam": true, as gpu_memory.py ran DeepSpeed (at ZeRO-0 that selects
FP16_UnfusedOptimizer).
The step peak is not checked: the plan under-predicts Hugging Face's activations (docs/plan.md).

    python3 plan_deepspeed_measured_test.py ZEROCHECK_BINARY REPO_ROOT
"""
import json
import os
import subprocess
import sys

OPEN = set()  # (stage, model) pairs whose construction is a known, named difference: none today


def main():
    zc, root = sys.argv[1], sys.argv[2]
    measured = os.path.join(root, "reference/deepspeed/measured/h200-deepspeed-0.19.8.jsonl")
    shapes = {n: os.path.join(root, "examples/plan/shapes", n + ".json") for n in ("gpt2-medium", "llama-1b")}
    failures, checked, construction_checked = [], 0, 0
    tmp = os.environ.get("TMPDIR", "/tmp")
    for line in open(measured):
        m = json.loads(line)
        stage, name, mb = m["stage"], m["model"], m["micro_batch"]
        cfg = json.load(open(os.path.join(root, "examples/plan", f"zero{max(stage, 1)}.json")))
        cfg["zero_optimization"]["stage"] = stage
        cfg["optimizer"]["params"]["torch_adam"] = True  # as gpu_memory.py ran DeepSpeed
        cfg_path = os.path.join(tmp, f"zc-plan-measured-{os.getpid()}-{stage}.json")
        json.dump(cfg, open(cfg_path, "w"))
        out = subprocess.run([zc, "plan", "--config", cfg_path, "--model-json", shapes[name], "--world-size", "1",
                              "--gpu", "h200", "--micro-batch", str(mb), "--no-deepspeed", "--json"],
                             capture_output=True, text=True)
        os.unlink(cfg_path)
        if out.returncode != 0:
            failures.append(f"{name} stage {stage} mb {mb}: zerocheck plan exited {out.returncode}: {out.stderr.strip()}")
            continue
        gpu = json.loads(out.stdout)["memory"]["gpu"]
        what = f"{name} ZeRO-{stage} micro-batch {mb}"
        for k, v in m["model_states_at_end"].items():
            planned = gpu["category_peaks"].get(k, 0)
            if planned != v:
                failures.append(f"{what}: {k}: plan {planned} bytes, DeepSpeed {v}")
        checked += 1
        if (stage, name) in OPEN:
            continue
        diff = gpu["construction_peak_bytes"] - m["construction_peak_bytes"]
        if abs(diff) > max(1 << 20, m["construction_peak_bytes"] // 1000):
            failures.append(f"{what}: construction peak: plan {gpu['construction_peak_bytes']} bytes, DeepSpeed "
                            f"{m['construction_peak_bytes']} ({diff:+d})")
        construction_checked += 1
    print(f"{checked} measured runs: model states compared; {construction_checked} construction peaks compared "
          f"(open, not compared: {sorted(OPEN)})")
    for f in failures:
        print("FAIL:", f)
    if checked != 16 or construction_checked != 16 - 2 * len(OPEN):
        print(f"FAIL: expected 16 runs and {16 - 2 * len(OPEN)} construction comparisons, got {checked} and {construction_checked}")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
