#!/usr/bin/env bash
# ds_python.sh SCRIPT [ARGS...]: runs SCRIPT with the DeepSpeed reference environment's python
# (scripts/ds-env.sh) from the source tree; "$ENV" in ARGS is replaced by the environment's path.
# A missing environment fails naming it, as the deepspeed label does, never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=$(bash scripts/ds-env.sh --print-env)
if [ ! -x "$env_dir/bin/python" ]; then
  echo "the DeepSpeed reference environment $env_dir is missing: run make ds-env"
  exit 1
fi
args=()
for a in "$@"; do args+=("${a//\$ENV/$env_dir}"); done
exec "$env_dir/bin/python" "${args[@]}"
