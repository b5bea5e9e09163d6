#!/usr/bin/env bash
# Installs the Debian packages tessera needs, then configures and builds it.
#
#   bash scripts/setup.sh [--build-dir DIR] [--no-build] [-Dname=value]...
#
#   --build-dir DIR  build folder, relative to the checkout (default: build,
#                    or $TESSERA_BUILD_DIR)
#   --no-build       install the packages only
#   -Dname=value     Meson options: passed to `meson setup` on the first run,
#                    to `meson configure` when the folder is already set up
#
# Fast when everything is present: the packages are checked with dpkg-query
# and apt-get runs only when one is missing. Needs root (or sudo) only then.
set -euo pipefail

build_dir=${TESSERA_BUILD_DIR:-build}
build=true
meson_options=()
while (($#)); do
  case $1 in
    --build-dir) build_dir=${2:?--build-dir needs a folder}; shift 2 ;;
    --build-dir=*) build_dir=${1#*=}; shift ;;
    --no-build) build=false; shift ;;
    -D*) meson_options+=("$1"); shift ;;
    -h|--help) sed -n '2,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "setup: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  meson ninja-build g++ clang pkg-config cmake python3
  nlohmann-json3-dev libfmt-dev libeigen3-dev doctest-dev libcli11-dev zlib1g-dev
  libbenchmark-dev libopenmpi-dev openmpi-bin dataset-fashion-mnist libclang-rt-14-dev valgrind
  libonnx-dev libprotobuf-dev libonnx-testdata
  pybind11-dev python3-dev python3-numpy python3-pytest
)

# One dpkg-query for all packages; a package it does not know is missing too.
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true)
missing=()
for package in "${packages[@]}"; do
  grep -qx "$package install ok installed" <<<"$installed" || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  as_root=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || { echo "setup: run as root to install packages" >&2; exit 1; }
    as_root=(sudo)
  fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

$build || exit 0

if [[ -f $build_dir/meson-private/coredata.dat ]]; then
  if ((${#meson_options[@]})); then
    echo "setup: meson configure $build_dir ${meson_options[*]}"
    meson configure "$build_dir" "${meson_options[@]}"
  fi
else
  echo "setup: meson setup $build_dir ${meson_options[*]}"
  meson setup "$build_dir" "${meson_options[@]}"
fi
echo "setup: building $build_dir"
ninja -C "$build_dir"
