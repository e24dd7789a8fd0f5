#!/usr/bin/env bash
# The verify job over MPI (ctest label mpi): `mpirun -np 2 zerocheck verify --profile quick` gives
# the verdicts, case counts, shrunk counterexamples and proofs of one process; a rank that dies
# mid-job ends it with a non-zero exit, its journal keeps the finished items, and --resume
# finishes the job with the same verdicts.
# usage: verify_mpi.sh ZEROCHECK WORKDIR MPIRUN [MPIRUN ARGS...]
set -uo pipefail
zc=$1 work=$2
shift 2
mpirun=("$@")
rm -rf "$work" && mkdir -p "$work"

run() {  # run NAME CMD...: the command must exit 0
  local name=$1
  shift
  if ! "$@" >"$work/$name.log" 2>&1; then
    echo "FAIL: $name exited non-zero: $*"
    tail -40 "$work/$name.log"
    exit 1
  fi
}

# Everything a verdict is made of; timings left out.
compare() {  # compare A B [--no-proofs]
  python3 - "$@" <<'PY'
import json, sys
def key(path, proofs):
    r = json.load(open(path))
    k = {"invariants": [(i["name"], i["holds"], i["cases"], i["discarded"], i["failure"]) for i in r["invariants"]],
         "bugs": [(b["id"], b["caught"], b["by"], b["cases_to_catch"], b["shrink_steps"],
                   json.dumps(b["scenario"], sort_keys=True), b["reproduce"]) for b in r["known_bugs"]],
         "determinism": (r["determinism"]["runs"], r["determinism"]["mismatches"]),
         "collectives": r["collectives_per_step"], "passed": r["passed"]}
    if proofs:
        k["proofs"] = [(p["name"], p["verdict"]) for p in r["proofs"]]
    return k, r.get("ranks", 1)
proofs = "--no-proofs" not in sys.argv
(a, ra), (b, rb) = key(sys.argv[1], proofs), key(sys.argv[2], proofs)
for field in a:
    if a[field] != b[field]:
        print(f"FAIL: {field} differ between {sys.argv[1]} ({ra} ranks) and {sys.argv[2]} ({rb} ranks):")
        print("  ", a[field]); print("  ", b[field]); sys.exit(1)
print(f"same verdicts: {sys.argv[1]} ({ra} ranks) and {sys.argv[2]} ({rb} ranks); "
      f"{len(a['invariants'])} invariants, {len(a['bugs'])} bug hunts, {len(a.get('proofs', []))} proofs")
PY
}

run one "$zc" verify --profile quick --jobs 2 --out "$work/one"
run two "${mpirun[@]}" -np 2 "$zc" verify --profile quick --jobs 1 --out "$work/two"
grep -q '"ranks": 2' "$work/two/results.json" || { echo "FAIL: results.json does not say 2 ranks"; exit 1; }
compare "$work/one/results.json" "$work/two/results.json" || exit 1

# A worker dies (SIGKILL) after 2 items: the job must end, not hang, and exit non-zero.
if "${mpirun[@]}" -np 2 -x ZC_VERIFY_DIE_RANK=1 -x ZC_VERIFY_DIE_AFTER=2 "$zc" verify --profile quick \
    --no-proofs --jobs 1 --out "$work/dead-worker" >"$work/dead-worker.log" 2>&1; then
  echo "FAIL: the job with a dead worker rank exited 0"
  exit 1
fi
# Rank 0 dies after journaling 5 of the 23 items: --resume must run exactly the other 18.
if "${mpirun[@]}" -np 2 -x ZC_VERIFY_DIE_RANK=0 -x ZC_VERIFY_DIE_AFTER=5 "$zc" verify --profile quick \
    --no-proofs --jobs 1 --out "$work/dead" >"$work/dead.log" 2>&1; then
  echo "FAIL: the job with a dead rank 0 exited 0"
  exit 1
fi
journaled=$(($(wc -l <"$work/dead/journal.jsonl") - 1))
echo "dead ranks ended both jobs; rank 0's journal kept $journaled finished items"
[ "$journaled" -eq 5 ] || { echo "FAIL: the journal kept $journaled items, not 5"; exit 1; }
run resume "$zc" verify --profile quick --no-proofs --jobs 2 --resume "$work/dead"
grep -q "resuming" "$work/resume.log" || { echo "FAIL: the resumed run did not say so"; exit 1; }
grep -q "6/23" "$work/resume.log" || { echo "FAIL: the resumed run did not start from 5 of 23 items"; exit 1; }
compare "$work/one/results.json" "$work/dead/results.json" --no-proofs || exit 1
echo PASS
