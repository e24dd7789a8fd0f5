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
for run in 1 2; do
  out=$("$zc" replay "$case_file" --against deepspeed==0.19.2 2>&1); rc=$?
  printf '%s\n' "$out"
  [ $rc -eq 1 ] || fail "run $run: replay on 0.19.2 exited $rc (1 expected: DeepSpeed reads a param before its all-gather)"
  for want in 'verdict: FAILS' 'layers\.0\.weight\[0\]: zerocheck -0\.004150390625 .* vs DeepSpeed nan' 'replayed exactly'; do
    grep -Eq "$want" <<<"$out" || fail "run $run on 0.19.2: the output does not say: $want"
  done
done
out=$("$zc" replay "$case_file" --against deepspeed 2>&1); rc=$?
printf '%s\n' "$out"
[ $rc -eq 0 ] && grep -q 'verdict: holds' <<<"$out" || fail "replay on 0.19.8 exited $rc (0 and 'verdict: holds' expected)"
out=$("$zc" replay "$i1_file" --against deepspeed==0.19.2 2>&1); rc=$?
printf '%s\n' "$out"
[ $rc -eq 1 ] || fail "I1 on 0.19.2 exited $rc (1 expected)"
for want in 'verdict: FAILS' 'params layers\.0\.weight\[0\] is nan .*DeepSpeed read memory nothing had written' 'replayed exactly'; do
  grep -Eq "$want" <<<"$out" || fail "I1 on 0.19.2: the output does not say: $want"
done
echo "PASS"
