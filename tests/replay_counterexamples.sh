#!/usr/bin/env bash
# replay_counterexamples.sh ZEROCHECK DIR: every counterexample a verify run saved in DIR carries a
# non-zero trace hash; `zerocheck replay` in a new process reproduces it (exit 1, "replayed
# exactly"); and the same scenario with its data seed moved by one gives another hash, so the hash
# is about the run, not a constant.
set -u
zc=$1 dir=$2
shopt -s nullglob
files=("$dir"/counterexamples/*.json)
[ ${#files[@]} -ge 9 ] || { echo "expected the 9 counterexamples (B1-B8, H1) in $dir, found ${#files[@]}"; exit 1; }
hash_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["trace_hash"])' "$1"; }
fails=0
for f in "${files[@]}"; do
  name=$(basename "$f")
  saved=$(hash_of "$f")
  if [ "$saved" = 0x0000000000000000 ]; then echo "$name: saved with trace hash 0"; fails=$((fails + 1)); continue; fi
  out=$("$zc" replay "$f" 2>&1); rc=$?
  if [ $rc -ne 1 ] || ! grep -q "with trace hash $saved: replayed exactly" <<<"$out"; then
    echo "$name: replay exited $rc without reproducing $saved:"; echo "$out" | tail -5; fails=$((fails + 1)); continue
  fi
  moved=$(mktemp)
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["scenario"]["seed"]+=1; json.dump(d,open(sys.argv[2],"w"))' "$f" "$moved"
  now=$("$zc" replay "$moved" 2>&1 | sed -n 's/^trace hash: //p')
  rm -f "$moved"
  if [ -z "$now" ] || [ "$now" = "$saved" ]; then
    echo "$name: seed + 1 gave trace hash '$now', the saved one is $saved"; fails=$((fails + 1)); continue
  fi
  echo "$name: $saved replayed exactly; seed + 1 gives $now"
done
[ $fails -eq 0 ] || { echo "$fails counterexample(s) without a real, reproducible hash"; exit 1; }
