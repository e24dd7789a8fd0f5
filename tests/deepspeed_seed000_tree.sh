#!/usr/bin/env bash
# Seed 000's before/after on a DeepSpeed source tree: the sdist of 0.19.7 (whose backward prologue
# and epilogue still enter the ZeRO DeepCompile hooks unless the pass is AutoTP), unpacked, must
# fail I3 on zerocheck verify --against deepspeed@TREE; the same tree with the PR's change applied
# here (both gates use uses_parallelization_pass_only()) must pass. The sdist is kept in the build
# directory, so the two trees' overlays (keyed by content) are reused by later runs.
#   tests/deepspeed_seed000_tree.sh ZEROCHECK WORKDIR
set -euo pipefail
zc=$1 work=$2
src="$(cd "$(dirname "$0")/.." && pwd)"
python="$(bash "$src/scripts/ds-env.sh" --print-env)/bin/python"
bash "$src/scripts/ds-env.sh"
mkdir -p "$work"
sdist="$work/deepspeed-0.19.7.tar.gz"
if [ ! -f "$sdist" ]; then
  "$python" -m pip --disable-pip-version-check download -q --no-deps --no-binary :all: deepspeed==0.19.7 -d "$work"
fi
for side in before after; do
  rm -rf "$work/$side" && mkdir -p "$work/$side" && tar -xzf "$sdist" -C "$work/$side"
done
engine="$work/after/deepspeed-0.19.7/deepspeed/runtime/engine.py"
gate='if self.is_deepcompile_active() and not self.compile_autotp():'
[ "$(grep -cF "$gate" "$engine")" = 2 ] || { echo "FAIL: 0.19.7's engine.py does not have the two gates seed 000 changes"; exit 1; }
sed -i 's/if self.is_deepcompile_active() and not self.compile_autotp():/if self.is_deepcompile_active() and not self.uses_parallelization_pass_only():/' "$engine"

status=0
set +e
out=$("$zc" verify --against "deepspeed@$work/before/deepspeed-0.19.7" --only I3 --out "$work/out-before" 2>&1); rc=$?
printf '%s\n' "$out"
if [ $rc -ne 1 ] || ! grep -Eq 'I3-no-deepcompile-for-parallel-passes +fails .*DeepCompile handle was requested' <<<"$out"; then
  echo "FAIL: the tree without the change should fail I3 with the handle requested (exit $rc)"; status=1
fi
out=$("$zc" verify --against "deepspeed@$work/after/deepspeed-0.19.7" --only I3 --out "$work/out-after" 2>&1); rc=$?
printf '%s\n' "$out"
if [ $rc -ne 0 ] || ! grep -Eq 'I3-no-deepcompile-for-parallel-passes +holds' <<<"$out"; then
  echo "FAIL: the tree with the PR's change should hold I3 (exit $rc)"; status=1
fi
[ $status = 0 ] && echo "seed 000: 0.19.7 tree FAILED, with the PR's change PASSED, as in the PR"
exit $status
