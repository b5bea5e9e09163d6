#!/usr/bin/env bash
# Sets up and builds tessera (scripts/setup.sh), then runs the main job:
# training the MNIST replicated-tensor-sharding sample from its JSON config
# (`tessera train samples/configs/mnist_rts.json`).
#
#   bash scripts/run.sh [--build-dir DIR] [-Dname=value]...
set -euo pipefail

build_dir=${TESSERA_BUILD_DIR:-build}
setup_args=()
while (($#)); do
  case $1 in
    --build-dir) build_dir=${2:?--build-dir needs a folder}; shift 2 ;;
    --build-dir=*) build_dir=${1#*=}; shift ;;
    -h|--help) sed -n '2,5s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) setup_args+=("$1"); shift ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh --build-dir "$build_dir" "${setup_args[@]}"
echo "run: tessera train samples/configs/mnist_rts.json"
exec "$build_dir/samples/tessera/tessera" train samples/configs/mnist_rts.json
