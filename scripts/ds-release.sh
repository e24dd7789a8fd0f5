#!/usr/bin/env bash
# Makes any DeepSpeed the reference can run: a release from the package index (deepspeed==X.Y.Z) or a
# source tree (a git checkout or an unpacked sdist: DIR). Each gets an overlay beside the pinned
# environment (scripts/ds-env.sh), keyed by its version or its tree's content hash:
#
#   ${ZC_DS_RELEASES:-<cache>/zerocheck/ds-releases}/deepspeed-X.Y.Z/site   (or tree-<hash>/site)
#
# holding only that DeepSpeed (pip --target, --no-deps). It runs on the torch environment that
# reference/deepspeed/torch_ranges.txt names for its version, with site/ first on PYTHONPATH, so a
# new release costs one DeepSpeed download (a few MB), never another torch. Its CPU ops are
# prebuilt into the overlay's own torch_extensions/ and reused across runs. (Not shared between
# overlays even when the op sources are identical: torch's JIT keys a build by its include paths,
# which name the overlay, so a shared build is rebuilt by every worker that switches overlay.) Prints progress and the time and disk each step took, on stderr; on success prints
# the overlay's directory on stdout. Idempotent: a complete overlay is reused silently.
#
# Errors (exit 2, one line on stderr naming the DeepSpeed and the cause): a version that is not on
# the package index, a directory that is not a DeepSpeed tree, a release no torch in the table runs,
# one that cannot be imported, one whose ops do not build.
#
#   scripts/ds-release.sh deepspeed==0.15.3 [--all-ops]
#   scripts/ds-release.sh /path/to/DeepSpeed [--all-ops]
#
# The workers need the shared-memory comm op to start; the seeds' checks need nothing else. CPU Adam
# and fused Adam (the comparison with zerocheck's simulator) are built with --all-ops.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
what="${1:-}"
all_ops="${2:-}"
[ -n "$what" ] || { echo "usage: scripts/ds-release.sh deepspeed==X.Y.Z | DIR" >&2; exit 64; }

cache="${XDG_CACHE_HOME:-$HOME/.cache}/zerocheck"
releases="${ZC_DS_RELEASES:-$cache/ds-releases}"
mkdir -p "$releases"

# The reason goes to $ZC_DS_RELEASE_ERROR when zerocheck asks (it prints it once, as its error).
fail() {
  if [ -n "${ZC_DS_RELEASE_ERROR:-}" ]; then echo "$label: $*" > "$ZC_DS_RELEASE_ERROR"; else echo "ds-release: $label: $*" >&2; fi
  exit 2
}
say() { echo "ds-release: $label: $*" >&2; }
mb() { du -sm "$1" 2>/dev/null | cut -f1; }

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }

if [[ "$what" == deepspeed==* ]]; then
  version="${what#deepspeed==}"
  label="deepspeed==$version"
  [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "'$version' is not a release version (X.Y.Z)"
  key="deepspeed-$version"
else
  dir="$(cd "$what" 2>/dev/null && pwd)" || { label="$what"; fail "no such directory"; }
  label="$dir"
  [ -f "$dir/deepspeed/__init__.py" ] && [ -f "$dir/version.txt" ] && [ -f "$dir/setup.py" ] ||
    fail "not a DeepSpeed source tree (a git checkout or an unpacked sdist has deepspeed/__init__.py, version.txt and setup.py)"
  version="$(tr -d '[:space:]' < "$dir/version.txt")"
  # The tree's content: every file pip would package (its Python, its op sources, the build files).
  hash="$(cd "$dir" && find deepspeed csrc op_builder setup.py version.txt -type f ! -path '*/__pycache__/*' \
            ! -name '*.pyc' 2>/dev/null | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
  key="tree-$version-$hash"
fi

# The torch environment for this version (reference/deepspeed/torch_ranges.txt).
env_name=""
while read -r lo hi torch_v envn _; do
  case "$lo" in ''|\#*) continue ;; esac
  if version_ge "$version" "$lo" && { [ "$hi" = "-" ] || version_ge "$hi" "$version"; }; then env_name="$envn"; torch_pin="$torch_v"; break; fi
done < "$src/reference/deepspeed/torch_ranges.txt"
[ -n "$env_name" ] || fail "no torch in reference/deepspeed/torch_ranges.txt runs DeepSpeed $version (the table starts at 0.14.0)"
case "$env_name" in
  ds-env) base="${ZC_DS_ENV:-$cache/ds-env}"; bash "$src/scripts/ds-env.sh" ;;
  *) fail "torch_ranges.txt names environment '$env_name', which scripts/ds-release.sh cannot make" ;;
esac
python="$base/bin/python"

out="$releases/$key"
stamp="$out/.zerocheck-complete"
exec 9>"$releases/.$key.lock"
flock 9  # one maker per overlay; a concurrent caller waits and then reuses it
if [ -f "$stamp" ] && [ "$all_ops" != "--all-ops" ]; then echo "$out"; exit 0; fi

t0=$(date +%s)
pip=("$python" -m pip --disable-pip-version-check --no-input --no-cache-dir)
if [ -f "$stamp" ]; then
  :  # made before; only ops to add (--all-ops)
elif [ -n "${dir:-}" ]; then
  rm -rf "$out"; mkdir -p "$out"
  say "installing the tree (DeepSpeed $version, content $hash) into $out/site"
  DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "${pip[@]}" install -q --no-deps --no-build-isolation --target "$out/site" "$dir" \
    > "$out/pip.log" 2>&1 || { tail -3 "$out/pip.log" >&2; rm -rf "$out"; fail "pip could not install the tree (see above)"; }
else
  rm -rf "$out"; mkdir -p "$out"
  say "downloading and installing DeepSpeed $version from the package index into $out/site"
  if ! DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "${pip[@]}" install -q --no-deps --no-build-isolation --target "$out/site" \
         "deepspeed==$version" > "$out/pip.log" 2>&1; then
    if grep -q "No matching distribution\|Could not find a version" "$out/pip.log"; then
      known="$(grep -o 'from versions: .*)' "$out/pip.log" | tr -d ')' | tr ',' '\n' | sed 's/from versions: //; s/ //g' |
               sort -V | tail -5 | tr '\n' ' ')"
      rm -rf "$out"
      fail "no such release on the package index (the newest are: ${known:-unknown})"
    fi
    tail -3 "$out/pip.log" >&2
    rm -rf "$out"
    fail "pip could not install it (see above)"
  fi
fi
t1=$(date +%s)
site_mb=$(mb "$out/site")
say "installed in $((t1 - t0)) s, ${site_mb} MB"

run_py() {
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 PYTHONPATH="$out/site:$src/reference/deepspeed" \
    TORCH_EXTENSIONS_DIR="${ops_dir:-}" timeout 900 "$python" "$@"
}
got="$(run_py -c 'import deepspeed, torch; print(deepspeed.__version__, deepspeed.__file__)' 2> "$out/import.log" | tail -1)" ||
  { err="$(grep -v '^\[' "$out/import.log" | tail -1)"; rm -rf "$out"; fail "cannot be imported with torch $torch_pin: $err"; }
case "$got" in "$version"*" $out/site/"*) ;; *) rm -rf "$out"; fail "importing it gave '$got', not DeepSpeed $version from $out/site" ;; esac

ops_dir="$out/torch_extensions"
mkdir -p "$ops_dir"
want="ShareMemCommBuilder"
[ "$all_ops" = "--all-ops" ] && want="ShareMemCommBuilder CPUAdamBuilder FusedAdamBuilder"
todo=""
for op in $want; do grep -qx "built $op\|absent $op" "$ops_dir/.zerocheck-built" 2>/dev/null || todo="$todo $op"; done
if [ -n "$todo" ]; then
  say "building its CPU ops ($todo ) into $ops_dir"
  t2=$(date +%s)
  run_py - $todo > "$out/ops.log" 2>&1 <<'PY' || { tail -3 "$out/ops.log" >&2; rm -rf "$out"; fail "its CPU ops do not build with torch $torch_pin (see above)"; }
import sys
import build_lock  # torch's extension lock as an flock (reference/deepspeed/build_lock.py)
build_lock.install()
import deepspeed.ops.op_builder.cpu as builders
for name in sys.argv[1:]:
    if hasattr(builders, name):
        getattr(builders, name)().load(verbose=False)
        print("built", name)
    else:
        print("absent", name)
PY
  { grep -h '^built\|^absent' "$out/ops.log" || true; } >> "$ops_dir/.zerocheck-built"
  { grep -h '^built\|^absent' "$out/ops.log" || true; } | while read -r line; do say "op $line"; done
  say "ops built in $(($(date +%s) - t2)) s, $(mb "$ops_dir") MB"
fi

t3=$(date +%s)
{
  echo "deepspeed $version"
  echo "python $python"
  echo "torch $torch_pin"
  echo "ops $ops_dir"
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((t3 - t0)) s; overlay ${site_mb} MB; ops $(mb "$ops_dir") MB"
} > "$stamp"
say "ready in $((t3 - t0)) s: ${site_mb} MB beside the shared torch environment, ops $(mb "$ops_dir") MB"
echo "$out"
