#!/usr/bin/env bash
# The verify job's speed-up over MPI ranks: the same job (same seed, --jobs 1 per rank) at K = 1
# and K = 2, wall time each, and the ratio; both runs must give the same verdicts. A benchmark,
# not a test: the figure depends on the machine and its load (`nproc` and the load average are
# printed with it).
# usage: scripts/bench-verify-mpi.sh [PROFILE] [extra verify options...]   (default: quick --no-proofs)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-quick}
shift || true
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(--no-proofs)
zc=build/default/cli/zerocheck
mpirun=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
out=$(mktemp -d)
declare -A wall
for k in 1 2; do
  start=$(date +%s.%N)
  "${mpirun[@]}" -np "$k" "$zc" verify --profile "$profile" --jobs 1 --out "$out/k$k" "${extra[@]}" >"$out/k$k.log" 2>&1
  wall[$k]=$(echo "$(date +%s.%N) - $start" | bc)
done
python3 - "$out" "$profile" "${wall[1]}" "${wall[2]}" "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
out, profile, w1, w2, cores, load = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
v = [json.load(open(f"{out}/k{k}/results.json")) for k in (1, 2)]
key = lambda r: ([(i["name"], i["holds"], i["cases"]) for i in r["invariants"]],
                 [(b["id"], b["caught"], b["by"], b["cases_to_catch"]) for b in r["known_bugs"]],
                 [(p["name"], p["verdict"]) for p in r["proofs"]])
same = key(v[0]) == key(v[1])
print(f"verify --profile {profile} --jobs 1: K=1 {w1:.1f} s, K=2 {w2:.1f} s, speed-up {w1 / w2:.2f}x "
      f"({cores} cores, load {load} at the end); verdicts {'identical' if same else 'DIFFER'}")
sys.exit(0 if same else 1)
PY
rm -rf "$out"
