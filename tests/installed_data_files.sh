#!/usr/bin/env bash
# An installed zerocheck reads its data files beside itself (engine/data_files.h), not from the
# source tree: install into a scratch prefix, change the installed hardware.json's H100 name, and
# check that plan prints the changed name. Usage: installed_data_files.sh BUILD_DIR
set -euo pipefail
build=$1
prefix=$(mktemp -d /tmp/zc-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/zerocheck"
test -f "$prefix/share/zerocheck/reference/deepspeed/worker.py"
sed -i 's/"NVIDIA H100 SXM5 80GB"/"Installed-copy H100"/' "$prefix/share/zerocheck/plan/hardware.json"
grep -q "Installed-copy H100" "$prefix/share/zerocheck/plan/hardware.json"
cat > "$prefix/cfg.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW"},
 "zero_optimization": {"stage": 1}}
JSON
out=$(cd / && "$prefix/bin/zerocheck" plan --config "$prefix/cfg.json" --model llama-tiny --world-size 2 --no-deepspeed)
printf '%s\n' "$out" | head -2
grep -q "on 2 x Installed-copy H100" <<<"$out" || { echo "installed_data_files: plan did not read the installed hardware.json"; exit 1; }
echo "installed_data_files: the installed binary reads $prefix/share/zerocheck/plan/hardware.json"
