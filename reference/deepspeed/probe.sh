#!/bin/bash
# Runs one probe of probes.py on W ranks outside zerocheck's pool, to debug it (`zerocheck verify
# --against deepspeed` runs i3 and i4 through the pool): reference/deepspeed/probe.sh NAME [W];
# ZC_I3_RUNS="autosp:1,autotp:3" narrows i3.
# Rank 0 writes the facts to ${ZC_PROBE_LOGS:-/tmp}/probe-NAME.json and prints the path; each rank's
# output goes to probe-NAME-rankR.log there.
set -euo pipefail
name=${1:?usage: probe.sh NAME [WORLD]}
world=${2:-1}
env_dir=${ZC_DS_ENV:-$HOME/.cache/zerocheck/ds-env}
logs=${ZC_PROBE_LOGS:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$env_dir/bin/python" ] || { echo "probe.sh: no DeepSpeed environment at $env_dir (run scripts/ds-env.sh)" >&2; exit 2; }
port=$((20000 + RANDOM % 20000))
pids=()
for ((r = 0; r < world; r++)); do
  (cd "$here" && RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR="$env_dir/torch_extensions" \
    timeout 1800 "$env_dir/bin/python" -c "
import datetime, json, sys, deepspeed
deepspeed.init_distributed(dist_backend='gloo', timeout=datetime.timedelta(seconds=600))
import probes
facts = probes.PROBES[sys.argv[1]]()
if int(sys.argv[2]) == 0:
    with open(sys.argv[3], 'w') as f:
        json.dump(facts, f, indent=1)
" "$name" "$r" "$logs/probe-$name.json" > "$logs/probe-$name-rank$r.log" 2>&1) &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
[ "$status" -eq 0 ] && echo "$logs/probe-$name.json"
exit $status
