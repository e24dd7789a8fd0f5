#!/usr/bin/env bash
# Runs gather_trace.py on WORLD local CPU processes (gloo) in the DeepSpeed reference environment
# and prints rank 0's all_gather log. Usage: gather_trace.sh WORLD 'JSON' [PORT]
set -euo pipefail
W=$1; CFG=$2; PORT=${3:-29611}
here=$(cd "$(dirname "$0")" && pwd)
env_dir=${ZC_DS_ENV:-$HOME/.cache/zerocheck/ds-env}
py=$env_dir/bin/python
[[ -x $py ]] || { echo "gather_trace: no DeepSpeed environment at $env_dir: run scripts/ds-env.sh" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for ((r = 0; r < W; r++)); do
  RANK=$r WORLD_SIZE=$W LOCAL_RANK=$r LOCAL_SIZE=$W MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT DS_ACCELERATOR=cpu \
    CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR=$env_dir/torch_extensions ZCG_CFG="$CFG" \
    "$py" "$here/gather_trace.py" > "$out/out.$r" 2> "$out/err.$r" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
if [[ $rc != 0 ]]; then tail -20 "$out"/err.*; exit "$rc"; fi
grep -E "^(PARAMS|MODULES|AG|TOTALS|AG_SUMMARY)" "$out/out.0"
