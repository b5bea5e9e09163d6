#!/usr/bin/env bash
# The training step of torchvision's ResNet-18, MobileNetV2 and
# EfficientNet-B0 (32 x 32, batch 8) in tessera against PyTorch on the same
# threads: builds tessera_bench_onnx_train in a release build, then runs
# bench/zoo_speed.py (export, interleaved rounds, medians; see its header).
#
#   bash bench/zoo_speed.sh [BUILD_DIR] [ROUNDS] [THREADS] [-- more zoo_speed.py options]
#
# BUILD_DIR (default build-bench-release) receives the release build.
# Needs Debian's python3-torch and python3-torchvision, libonnx-dev.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-bench-release}
rounds=${2:-5}
threads=${3:-2}
shift $(($# < 3 ? $# : 3))
[[ ${1:-} == -- ]] && shift
[[ $build = /* ]] || build="$root/$build"

if [[ ! -f "$build/build.ninja" ]]; then
  meson setup "$build" "$root" --buildtype=release >/dev/null
fi
ninja -C "$build" bench/tessera_bench_onnx_train >/dev/null
uptime
/usr/bin/python3 "$root/bench/zoo_speed.py" --cpp "$build/bench/tessera_bench_onnx_train" --rounds "$rounds" \
  --threads "$threads" "$@"
