#!/usr/bin/env bash
# Sets up and builds tessera (scripts/setup.sh), then runs the main job:
# training the MNIST replicated-tensor-sharding sample from its JSON config
# (`tessera train samples/configs/mnist_rts.json`).
#
#   bash scripts/run.sh [--build-dir DIR] [-Dname=value]...
#
# The build is the benchmark's (bench/run.sh): release (-O3, NDEBUG), by
# default in build-release/ without the test suites. It runs on any x86-64:
# the GEMM kernels are chosen at run time from the CPU, so no -march=native
# is needed. The device uses every CPU of the process
# (TESSERA_NUM_THREADS=N for fewer).
set -euo pipefail

build_dir=${TESSERA_BUILD_DIR:-build-release}
setup_args=(-Dbuildtype=release)
while (($#)); do
  case $1 in
    --build-dir) build_dir=${2:?--build-dir needs a folder}; shift 2 ;;
    --build-dir=*) build_dir=${1#*=}; shift ;;
    -h|--help) sed -n '2,11s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) setup_args+=("$1"); shift ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Its own folder holds the main job only; a folder named by the user keeps
# its tests.
if [[ $build_dir == build-release && ! -d $build_dir ]]; then setup_args=(-Dtests=disabled "${setup_args[@]}"); fi

bash scripts/setup.sh --build-dir "$build_dir" "${setup_args[@]}"
echo "run: tessera train samples/configs/mnist_rts.json"
exec "$build_dir/samples/tessera/tessera" train samples/configs/mnist_rts.json
