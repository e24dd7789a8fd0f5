#!/usr/bin/env bash
# One run on a GPU machine verifies the GPU backend, in under 8 minutes on a 16-core host:
#   1. builds zerocheck, zc_gpu_tests and zc_gpu_bench (preset `release`), unless --prebuilt DIR
#      names a folder that already holds the three binaries (built elsewhere for this machine);
#   2. runs the `gpu` tests: the Device conformance table (CudaDevice vs HostDevice), the Comm
#      conformance table on NCCL, ordering, split, the watchdog (2+ GPUs), engine vs simulator,
#      and meta-mode peaks (zerocheck plan's figures) against CudaDevice's allocator (gpu_memory.md);
#   3. runs `verify-real --backend cuda` (12 seeded scenarios, bit for bit against the simulator);
#   4. runs the GPU benchmarks (Adam and a reduction against a D2D copy; NCCL all_reduce busbw);
#   5. prints a short table, and leaves the details in OUT (default reports/gpu).
# With G > 1 GPUs and mpirun present, steps 2-4 run as `mpirun -np G`; otherwise as one process on
# one GPU without MPI. Exit status: 0 when every step passed.
#
#   scripts/gpu-check.sh [--prebuilt DIR] [--out OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=""
out="reports/gpu"
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "gpu-check: unknown argument $1 (use --prebuilt DIR, --out OUT)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
start=$(date +%s)
declare -a rows=()
status=0

step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs to OUT/NAME.log, records a row
  local name="$1" limit="$2"; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local secs=$(( $(date +%s) - t0 ))
  local verdict="pass"
  if [ $rc -eq 124 ]; then verdict="TIMED OUT after ${limit}s"; status=1
  elif [ $rc -ne 0 ]; then verdict="FAIL (exit $rc, see $out/$name.log)"; status=1; fi
  rows+=("| $name | $verdict | ${secs} s |")
  echo "gpu-check: $name: $verdict (${secs} s)"
  return $rc
}

if [ -n "$prebuilt" ]; then
  bin="$(cd "$prebuilt" && pwd)"
  for b in zerocheck zc_gpu_tests zc_gpu_bench; do
    [ -x "$bin/$b" ] || { echo "gpu-check: --prebuilt $prebuilt has no $b" >&2; exit 2; }
  done
  zerocheck="$bin/zerocheck"; tests="$bin/zc_gpu_tests"; bench="$bin/zc_gpu_bench"
  # A bundle from scripts/gpu-bundle.sh: bin/ holds wrappers (they set the library path and pick
  # the loader); the real binaries are in real/, which is what ldd must look at.
  [ -d "$bin/../real" ] && elf="$bin/../real/zc_gpu_tests"
  [ -d "$bin/../lib" ] && export LD_LIBRARY_PATH="$(cd "$bin/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  step deps 300 bash scripts/deps.sh || { echo "gpu-check: Debian packages missing and not installable; build elsewhere and use --prebuilt" >&2; exit 2; }
  step configure 120 cmake --preset release || exit 2
  step build 420 cmake --build --preset release -j "$(nproc)" --target zerocheck zc_gpu_tests zc_gpu_bench || exit 2
  zerocheck="build/release/cli/zerocheck"; tests="build/release/tests/zc_gpu_tests"; bench="build/release/bench/zc_gpu_bench"
fi

# NCCL: the one the binaries were linked against, else any libnccl.so.2 on this machine (a pip
# wheel's, say), found once.
if ldd "${elf:-$tests}" 2>/dev/null | grep -q 'libnccl.so.2 => not found'; then
  nccl=$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
  [ -n "$nccl" ] && export LD_LIBRARY_PATH="$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "gpu-check: NCCL from ${nccl:-nowhere (not found)}"
fi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
launch=()
if [ "${gpus:-0}" -gt 1 ] && command -v mpirun >/dev/null; then
  launch=(mpirun -np "$gpus")
  [ "$(id -u)" -eq 0 ] && launch+=(--allow-run-as-root)
fi
echo "gpu-check: ${gpus:-0} GPU(s) seen by nvidia-smi; launching as: ${launch[*]:-one process}"

export ZC_GPU_REPORT_DIR="$out"
step gpu-tests 240 "${launch[@]}" "$tests"
grep -q "every test skips" "$out/gpu-tests.log" && { rows+=("| (gpu-tests) | SKIPPED: $(grep -m1 'every test skips' "$out/gpu-tests.log") | |"); status=1; }
step verify-real 180 "${launch[@]}" "$zerocheck" verify-real --backend cuda --scenarios 12 --seed 7 --out "$out/verify-real"
step bench 120 "${launch[@]}" "$bench" --reps 20
grep -q "zc_gpu_bench: skipped" "$out/bench.log" && { rows+=("| (bench) | SKIPPED: no usable GPU | |"); status=1; }

echo
echo "## zerocheck gpu-check: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), ${gpus:-0} GPU(s), $(( $(date +%s) - start )) s"
echo
echo "| step | result | time |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
for f in device_conformance.md comm_conformance.md gpu_memory.md bench.md; do [ -f "$out/$f" ] && cat "$out/$f"; done
[ -f "$out/verify-real/report.md" ] && tail -n +3 "$out/verify-real/report.md"
exit $status
