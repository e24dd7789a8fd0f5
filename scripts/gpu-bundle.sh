#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --prebuilt needs on a GPU machine that cannot build zerocheck
# (no Debian packages, no network: this workplace's lent device machine): the three binaries,
# stripped, and every shared library they load except glibc's own and NCCL (218 MB; the GPU
# machine's own libnccl.so.2 is used, found by gpu-check.sh). Run it here after a build:
#
#   scripts/gpu-bundle.sh [PRESET]        # default preset: build/default
#   -> .gpu-bundle/bin/{zerocheck,zc_gpu_tests,zc_gpu_bench}, .gpu-bundle/lib/*.so*
#
# then on the GPU machine: scripts/gpu-check.sh --prebuilt .gpu-bundle/bin
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
build="build/$preset"
cmake --build "$build" --target zerocheck zc_gpu_tests zc_gpu_bench >/dev/null
rm -rf .gpu-bundle
mkdir -p .gpu-bundle/bin .gpu-bundle/lib
for b in cli/zerocheck tests/zc_gpu_tests bench/zc_gpu_bench; do
  strip -o ".gpu-bundle/bin/$(basename "$b")" "$build/$b"
done
for b in .gpu-bundle/bin/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" .gpu-bundle/lib/; done
du -sh .gpu-bundle | sed 's/^/gpu-bundle: /'
