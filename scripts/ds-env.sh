#!/usr/bin/env bash
# Creates the DeepSpeed reference's Python environment (reference/deepspeed/requirements.txt, every
# package pinned) outside the checkout, so that a fresh clone and CI reuse it, and prebuilds the
# DeepSpeed CPU ops the reference runs (FusedAdam, CPUAdam) into TORCH_EXTENSIONS_DIR beside it, so
# that no worker compiles at run time. Idempotent and quiet: a complete environment whose stamp
# matches the requirements is reused and nothing is printed; otherwise it prints what it installs,
# the download and disk figures and the time. PyPI only.
#
#   ZC_DS_ENV    where the environment lives (default ${XDG_CACHE_HOME:-$HOME/.cache}/zerocheck/ds-env;
#                the C++ runner, props/reference_pool.cpp, resolves the same default)
#   --print-env  print the path and exit
set -euo pipefail
cd "$(dirname "$0")/.."

env_dir="${ZC_DS_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/zerocheck/ds-env}"
if [ "${1:-}" = "--print-env" ]; then echo "$env_dir"; exit 0; fi

req="reference/deepspeed/requirements.txt"
ops="FusedAdamBuilder CPUAdamBuilder ShareMemCommBuilder"
pkgs_want="packages $(sha256sum "$req" | cut -d' ' -f1)"
ops_want="ops $ops"
stamp="$env_dir/.zerocheck-complete"      # line 1: packages, line 2: ops, line 3: figures
if [ -f "$stamp" ] && [ "$(sed -n 1p "$stamp")" = "$pkgs_want" ] && [ "$(sed -n 2p "$stamp")" = "$ops_want" ]; then
  exit 0
fi

fail() { echo "ds-env: $*" >&2; exit 1; }

python="${ZC_PYTHON:-python3}"
command -v "$python" >/dev/null || fail "no $python on PATH: the reference needs Python 3.9-3.12 with venv"
"$python" -c 'import sys, venv; assert (3, 9) <= sys.version_info[:2] <= (3, 12), sys.version' 2>/dev/null ||
  fail "$python is not Python 3.9-3.12 with the venv module (torch 2.10.0 wheels need one)"

t0=$(date +%s)
dl_mb=0
if [ ! -f "$stamp" ] || [ "$(sed -n 1p "$stamp")" != "$pkgs_want" ]; then
  # Measured on 2026-11-30: 6.9 GB installed (torch and its CUDA runtime wheels), 98 MB of built ops,
  # about 3 GB downloaded. Ask for room for both plus pip's unpacking.
  need_gb=12
  mkdir -p "$(dirname "$env_dir")"
  free_kb=$(df -Pk "$(dirname "$env_dir")" | awk 'NR == 2 {print $4}')
  if [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
    fail "$(dirname "$env_dir") has $((free_kb / 1024 / 1024)) GB free; the DeepSpeed reference needs ${need_gb} GB" \
         "(torch's CUDA wheels). Free space, or set ZC_DS_ENV to a disk that has it."
  fi
  echo "ds-env: creating $env_dir (deepspeed 0.19.8, torch 2.10.0, pinned in $req)"
  rm -rf "$env_dir"
  "$python" -m venv "$env_dir"
  pip=("$env_dir/bin/python" -m pip --disable-pip-version-check --no-input --no-cache-dir)
  rx_before=$(awk 'NR > 2 && $1 !~ /lo:/ {s += $2} END {printf "%.0f", s}' /proc/net/dev)
  grep -v -E '^(#|$|deepspeed==)' "$req" > "$env_dir/.phase1.txt"
  grep -E '^deepspeed==' "$req" > "$env_dir/.phase2.txt"
  echo "ds-env: installing $(wc -l < "$env_dir/.phase1.txt") pinned packages (torch first: about 3 GB)"
  "${pip[@]}" install -q --no-deps -r "$env_dir/.phase1.txt" || fail "pip could not install $req (phase 1); see above"
  echo "ds-env: installing $(cat "$env_dir/.phase2.txt") from its sdist"
  DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "${pip[@]}" install -q --no-deps --no-build-isolation -r "$env_dir/.phase2.txt" ||
    fail "pip could not install deepspeed (phase 2); see above"
  "${pip[@]}" check >/dev/null || fail "pip check: the pinned set is inconsistent: $("${pip[@]}" check 2>&1 | head -3)"
  rx_after=$(awk 'NR > 2 && $1 !~ /lo:/ {s += $2} END {printf "%.0f", s}' /proc/net/dev)
  dl_mb=$(((rx_after - rx_before) / 1024 / 1024))
  printf '%s\n%s\n' "$pkgs_want" "ops none" > "$stamp"
fi

echo "ds-env: prebuilding DeepSpeed CPU ops ($ops) into $env_dir/torch_extensions"
DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES="" TORCH_EXTENSIONS_DIR="$env_dir/torch_extensions" \
  PYTHONPATH="$PWD/reference/deepspeed" "$env_dir/bin/python" - "$ops" <<'PY' || fail "building the DeepSpeed CPU ops failed; see above"
import sys
import build_lock  # torch's extension lock as an flock, the one the workers take (build_lock.py)
build_lock.install()
import deepspeed.ops.op_builder.cpu as builders
for name in sys.argv[1].split():
    getattr(builders, name)().load(verbose=False)
PY

t1=$(date +%s)
venv_mb=$(du -sm "$env_dir" | cut -f1)
ext_mb=$(du -sm "$env_dir/torch_extensions" | cut -f1)
{
  echo "$pkgs_want"
  echo "$ops_want"
  echo "installed $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((t1 - t0)) s; environment ${venv_mb} MB (ops ${ext_mb} MB); network ${dl_mb} MB received"
} > "$stamp"
echo "ds-env: done in $((t1 - t0)) s: ${venv_mb} MB on disk (built ops ${ext_mb} MB), ~${dl_mb} MB downloaded"
