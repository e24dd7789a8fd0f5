#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --prebuilt needs on a GPU machine that cannot build zerocheck
# (no Debian packages, no network: this workplace's lent device machine):
#   .gpu-bundle/real/   the three binaries, stripped;
#   .gpu-bundle/lib/    every shared library they load except glibc's own and NCCL (218 MB; the GPU
#                       machine's libnccl.so.2 is used, found by gpu-check.sh);
#   .gpu-bundle/glibc/  this machine's glibc and loader, used only where the GPU machine's glibc is
#                       older than the one the binaries were linked against;
#   .gpu-bundle/bin/    one wrapper per binary that picks the native or the bundled loader.
# Run it here after a build:  scripts/gpu-bundle.sh [PRESET]   (default preset: build/default)
# then on the GPU machine:    scripts/gpu-check.sh --prebuilt .gpu-bundle/bin
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
build="build/$preset"
cmake --build "$build" --target zerocheck zc_gpu_tests zc_gpu_bench >/dev/null
rm -rf .gpu-bundle
mkdir -p .gpu-bundle/bin .gpu-bundle/real .gpu-bundle/lib .gpu-bundle/glibc
for b in cli/zerocheck tests/zc_gpu_tests bench/zc_gpu_bench; do
  strip -o ".gpu-bundle/real/$(basename "$b")" "$build/$b"
done
glibc_re='/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so'
for b in .gpu-bundle/real/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' |
  sort -u | while read -r lib; do
    if echo "$lib" | grep -Eq "$glibc_re"; then
      cp -L "$lib" .gpu-bundle/glibc/
    elif ! echo "$lib" | grep -q '/libnccl\.so'; then
      cp -L "$lib" .gpu-bundle/lib/
    fi
  done
need=$(for f in .gpu-bundle/real/* .gpu-bundle/lib/*; do objdump -T "$f" 2>/dev/null; done |
       grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
for b in .gpu-bundle/real/*; do
  name=$(basename "$b")
  cat > ".gpu-bundle/bin/$name" <<WRAP
#!/usr/bin/env bash
# $name from a gpu-bundle: needs glibc $need; runs through the bundled loader where this one is older.
here="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")/.." && pwd)"
export LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
have=\$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print \$2}')
if [ -n "\$have" ] && [ "\$(printf '%s\n%s\n' "$need" "\$have" | sort -V | head -1)" = "$need" ]; then
  exec "\$here/real/$name" "\$@"
fi
exec "\$here/glibc/ld-linux-x86-64.so.2" --library-path "\$here/lib:\$here/glibc:\${LD_LIBRARY_PATH}" "\$here/real/$name" "\$@"
WRAP
  chmod +x ".gpu-bundle/bin/$name"
done
echo "gpu-bundle: $(du -sh .gpu-bundle | cut -f1) in .gpu-bundle (binaries need glibc $need; bundled loader used below that)"
