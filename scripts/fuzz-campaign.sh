#!/usr/bin/env bash
# The fuzz campaign (issue 19): builds the libFuzzer targets (preset fuzz: clang, ASan, UBSan) and
# runs each in turn, in process (no -jobs: libFuzzer would fork and log elsewhere), from a scratch
# copy of its seed corpus (fuzz/corpus is never written), then prints and writes per target:
# executions, exec/s, crashes, coverage and features.
#   scripts/fuzz-campaign.sh [--runs N | --seconds S] [--targets "config scenario ..."] [--out FILE]
# Defaults: 10,000,000 executions per target, every target, fuzz/campaign-results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
args="$*"

runs=10000000
seconds=0
targets="config scenario counterexample module"
out=fuzz/campaign-results.md
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --seconds) seconds="$2"; runs=0; shift 2 ;;
    --targets) targets="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: $0 [--runs N | --seconds S] [--targets LIST] [--out FILE]" >&2; exit 2 ;;
  esac
done

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target zc_fuzz_all

scratch=build/fuzz/campaign
rm -rf "$scratch"
mkdir -p "$scratch"
limit=(-runs="$runs")
[ "$seconds" -gt 0 ] && limit=(-max_total_time="$seconds")
commit=$(git rev-parse --short HEAD)

{
  echo "# Fuzz campaign results"
  echo
  local_changes=$(git diff --quiet HEAD -- . ':!fuzz/campaign-results.md' ||
                  echo ' + local changes')
  echo "Commit $commit$local_changes, $(date -u +%Y-%m-%d), $(nproc) cores, one target at a time,"
  echo "clang $(clang++-14 -dumpversion), ASan + UBSan (-fno-sanitize-recover=all), -max_len=4096"
  echo "-timeout=10 -rss_limit_mb=2048, limit ${limit[*]}."
  echo "Command: scripts/fuzz-campaign.sh $args"
  echo
  echo "| target | executions | exec/s | seconds | crashes | cov | ft | corpus |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
} >"$scratch/summary.md"
# cov: code edges libFuzzer's coverage reached; ft: its features (edges with hit counts and more).

status=0
for t in $targets; do
  work="$scratch/$t"
  mkdir -p "$work/corpus" "$work/crashes"
  cp fuzz/corpus/"$t"/* "$work/corpus/"
  log="$work/libfuzzer.log"
  start=$(date +%s)
  set +e
  ./build/fuzz/fuzz/zc_fuzz_"$t" "${limit[@]}" -seed=1 -max_len=4096 -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    -dict=fuzz/"$t".dict -artifact_prefix="$work/crashes/" "$work/corpus" >"$log" 2>&1
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*' || echo '?')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*' || echo '?')
  crashes=$(find "$work/crashes" -type f | wc -l)
  units=$(find "$work/corpus" -type f | wc -l)
  echo "| $t | $execs | $rate | $elapsed | $crashes | $cov | $ft | $units |" >>"$scratch/summary.md"
  echo "fuzz $t: $execs executions, $rate exec/s, $elapsed s, $crashes crash(es), cov $cov, ft $ft"
  echo "  log: $log"
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    status=1
    find "$work/crashes" -type f -exec echo "  crash input: {}" \;
    grep -m3 -E 'ERROR: |runtime error|terminate called|what\(\)' "$log" | sed 's/^/  /' || true
  fi
done

# What each crash was and how it was fixed, kept by hand beside the figures.
if [ -f fuzz/campaign-findings.md ]; then
  { echo; cat fuzz/campaign-findings.md; } >>"$scratch/summary.md"
fi
mkdir -p "$(dirname "$out")"
cp "$scratch/summary.md" "$out"
echo "summary: $out"
exit $status
