#!/usr/bin/env bash
# Installs the Debian packages zerocheck builds against, only those missing. Idempotent and quiet:
# prints what it installed, or nothing. Nothing is downloaded from anywhere but Debian's archive.
set -euo pipefail

pkgs=(
  cmake ninja-build g++ make
  libgtest-dev libgmock-dev librapidcheck-dev libbenchmark-dev
  libz3-dev libboost-context-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libopenmpi-dev openmpi-bin
  libxml2-dev
  libgoogle-perftools-dev
  clang-14 libclang-rt-14-dev
  chromium fonts-dejavu-core
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: installed ${#missing[@]} package(s)"
