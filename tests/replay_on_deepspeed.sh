#!/usr/bin/env bash
# A verify --config counterexample run on DeepSpeed (Note [A counterexample on DeepSpeed]): B7 in the
# engine fails I1 around examples/ds_config_zero2.json; the saved scenario replays exactly, holds on
# DeepSpeed 0.19.8 (DeepSpeed has no B7), and DeepSpeed computes the bug-free engine's values bit for
# bit. Bad input: an edited ds_config beside it, and a scenario the twin cannot run, each refused
# naming the cause.
#   tests/replay_on_deepspeed.sh ZEROCHECK CONFIG WORKDIR
set -uo pipefail
zc=$1 config=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
"$zc" verify --config "$config" --profile quick --only I1 --bugs B7 --jobs 1 --out "$work/v" >"$work/verify.log" 2>&1
grep -Eq '^B7 +yes' "$work/verify.log" || { cat "$work/verify.log"; fail "B7 was not caught around $config"; }
case_file="$work/v/counterexamples/B7-I1-coalesced-bit-exact.json"
[ -f "${case_file%.json}.ds_config.json" ] || fail "no ds_config beside $case_file"

out=$("$zc" replay "$case_file" --against deepspeed 2>&1); rc=$?
printf '%s\n' "$out"
# The B7 scenario clips; where torch's f32 root is neither model the comparison refuses it, naming
# the root: nothing to replay on this CPU (ctest's SKIP_RETURN_CODE 77).
if [ $rc -eq 2 ] && grep -q "torch's f32 sqrt on this CPU is neither" <<<"$out"; then
  echo "SKIPPED: the saved scenario clips and torch's f32 sqrt on this CPU is not modelled"; exit 77
fi
[ $rc -eq 0 ] || fail "replay --against deepspeed exited $rc (DeepSpeed holds I1: 0 expected)"
for want in 'verdict: FAILS' 'replayed exactly' 'deepspeed-I1-coalesced-bit-exact on DeepSpeed: holds' \
            'the engine \(no known bug switched on\) against DeepSpeed on this scenario: the same values and collectives, bit for bit'; do
  grep -Eq "$want" <<<"$out" || fail "the output does not say: $want"
done

# An edited ds_config is not what DeepSpeed would run: refused, naming the file.
cp -r "$work/v/counterexamples" "$work/edited"
sed -i 's/"lr": 0.01/"lr": 0.02/' "$work/edited/B7-I1-coalesced-bit-exact.ds_config.json"
out=$("$zc" replay "$work/edited/B7-I1-coalesced-bit-exact.json" --against deepspeed 2>&1); rc=$?
printf '%s\n' "$out"
[ $rc -eq 2 ] && grep -q "B7-I1-coalesced-bit-exact.ds_config.json is not the scenario's ds_config" <<<"$out" \
  || fail "an edited ds_config was not refused (exit $rc)"

# World 8 is outside the twin's domain: refused before any DeepSpeed runs, naming the feature.
python3 - "$case_file" "$work/world8.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["scenario"]["world"] = 8
json.dump(d, open(sys.argv[2], "w"))
PY
out=$("$zc" replay "$work/world8.json" --against deepspeed 2>&1); rc=$?
printf '%s\n' "$out"
[ $rc -eq 2 ] && grep -Eq "DeepSpeed's twin cannot run this scenario: .*world" <<<"$out" \
  || fail "a world-8 scenario was not refused naming the world (exit $rc)"
echo "PASS"
