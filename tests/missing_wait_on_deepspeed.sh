#!/usr/bin/env bash
# DeepSpeed 0.19.2's ZeRO-3 gather waits on its last collective only (docs/findings.md, defect 9):
# a race that, left to gloo's timing, read a wrong param in about one run in ten. The reference
# worker delivers an async collective's result at its wait() and poisons uninitialized memory
# (reference/deepspeed/deferred_comm.py), so the read that comes too early sees NaN in every run:
# the saved counterexample replays exactly, twice, on 0.19.2, and holds on 0.19.8, which waits on
# every handle.
# The same scenario's I1 on DeepSpeed alone fails there too, naming the unsound record (both of
# its runs read NaN alike, which a bare comparison of the two would let through).
#   tests/missing_wait_on_deepspeed.sh ZEROCHECK COUNTEREXAMPLE I1_COUNTEREXAMPLE
set -uo pipefail
zc=$1 case_file=$2 i1_file=$3
fail() { echo "FAIL: $*"; exit 1; }
# expect WHAT FILE TARGET RC PATTERN...: the replay of FILE on TARGET exits RC and says every PATTERN.
expect() {
  local what=$1 file=$2 target=$3 want_rc=$4 out rc
  shift 4
  out=$("$zc" replay "$file" --against "$target" 2>&1); rc=$?
  printf '%s\n' "$out"
  [ $rc -eq "$want_rc" ] || fail "$what: replay on $target exited $rc ($want_rc expected)"
  for want in "$@"; do
    grep -Eq "$want" <<<"$out" || fail "$what on $target: the output does not say: $want"
  done
}
# The saved scenario clips; where torch's f32 root is neither model the comparison refuses it,
# naming the root, and a replay on another release has nothing to compare (ctest's SKIP_RETURN_CODE 77).
out=$("$zc" replay "$case_file" --against deepspeed 2>&1)
if grep -q "torch's f32 sqrt on this CPU is neither" <<<"$out"; then
  printf '%s\n' "$out"; echo "SKIPPED: the saved scenario clips and torch's f32 sqrt on this CPU is not modelled"; exit 77
fi
for run in 1 2; do  # DeepSpeed reads a param before its all-gather, every run
  expect "run $run" "$case_file" deepspeed==0.19.2 1 'verdict: FAILS' \
    'layers\.0\.weight\[0\]: zerocheck -0\.004150390625 .* vs DeepSpeed nan' 'replayed exactly'
done
expect "the comparison" "$case_file" deepspeed 0 'verdict: holds'
expect "I1" "$i1_file" deepspeed==0.19.2 1 'verdict: FAILS' \
  'params layers\.0\.weight\[0\] is nan .*DeepSpeed read memory nothing had written' 'replayed exactly'
echo "PASS"
