#!/usr/bin/env bash
# The seeds' before/after table, produced by running zerocheck against the DeepSpeed code before
# and after each seed's fix (docs/deepspeed-releases.md quotes it). Each row is one
# `zerocheck verify --against ...` run; its verdict and one-line summary come from that run's
# deepspeed-seeds.json. Releases are made on first use (scripts/ds-release.sh). Seed 000's rows are
# the source tree of 0.19.7 without and with the PR's change (tests/deepspeed_seed000_tree.sh makes
# both trees). Prints a Markdown table on stdout; progress on stderr.
#   scripts/seed-table.sh [BUILD_DIR]
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build/default}"
zc="$build/cli/zerocheck"
out="$build/seed-table"
py="$(bash "$src/scripts/ds-env.sh" --print-env)/bin/python"
mkdir -p "$out"

rows=(
  "002_f62cef7345bfd50d|I4|deepspeed==0.15.1|before PR #6564"
  "002_f62cef7345bfd50d|I4|deepspeed==0.15.2|PR #6564 (copy and fake-tensor read fixed)"
  "002_f62cef7345bfd50d|I4|deepspeed==0.15.4|the seed's PR #6527"
  "002_f62cef7345bfd50d|I4|deepspeed==0.16.1|last before PR #6794"
  "002_f62cef7345bfd50d|I4|deepspeed==0.16.2|PR #6794"
  "001_03cee7fe9d0b6291|MB|deepspeed==0.18.9|before PR #7981"
  "001_03cee7fe9d0b6291|MB|deepspeed==0.19.0|PR #7981"
  "001_03cee7fe9d0b6291|I1|deepspeed==0.19.0|before PR #7992"
  "001_03cee7fe9d0b6291|I1|deepspeed==0.19.1|the first release with coalesce_grad_reduction (PR #7992)"
  "001_03cee7fe9d0b6291|I2|deepspeed==0.19.1|the first release with coalesce_grad_reduction (PR #7992)"
)
bash "$src/tests/deepspeed_seed000_tree.sh" "$zc" "$out/seed000" >&2 || true
echo "| seed | DeepSpeed | what it is | invariant | verdict | cases | counterexample or reason |"
echo "|---|---|---|---|---|---:|---|"
for side in before after; do
  f="$out/seed000/out-$side/tree-deepspeed-0.19.7/deepspeed-seeds.json"
  what=$([ $side = before ] && echo "0.19.7 sdist as a source tree" || echo "the same tree with the PR's change applied")
  "$py" - "$f" "000_c58ac685dbf6c8b5" "tree 0.19.7 ($side)" "$what" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {r['invariant']} | {r['verdict']} | {r['cases']} | {r['summary'][:200]} |")
PY
done
for row in "${rows[@]}"; do
  IFS='|' read -r seed inv target what <<<"$row"
  label="deepspeed-${target#deepspeed==}"
  echo "seed-table: $target $inv" >&2
  "$zc" verify --against "$target" --only "$inv" --seed-cases 16 --out "$out" >&2 || true
  "$py" - "$out/$label/deepspeed-seeds.json" "$seed" "${target#deepspeed==}" "$what" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {r['invariant']} | {r['verdict']} | {r['cases']} | {r['summary'][:200]} |")
PY
done
