#!/usr/bin/env bash
# Measures the training step of the two models exported from PyTorch in
# tests/data/onnx, the LeNet CNN (lenet.onnx) and the GPT-style block
# (gpt_block.onnx), imported by tessera (tessera_bench_onnx_train), against
# the same modules written in libtorch (bench/peer/torch_lenet.cpp,
# bench/peer/torch_gpt.cpp), all with plain SGD on one fixed batch, each on
# 1 thread and on THREADS threads (default: every CPU of the process).
#
#   bash bench/models.sh [BUILD_DIR] [REPS] [THREADS]
#
# BUILD_DIR (default build-bench-release) receives tessera's release build
# and the peer binaries. Each repetition runs tessera and libtorch back to
# back on 1 thread, then on THREADS; the table shows the median samples/s
# of REPS repetitions and the median of the per-repetition ratios.
# LENET_BATCH and GPT_BATCH (environment, default 64) set the batches; a
# GPT sample is one sequence of 8 tokens. The libtorch peers are built only
# where libtorch-dev is installed (with libopenblas0-pthread: without
# OpenBLAS, Debian's libtorch falls back to the reference BLAS and is an
# order of magnitude slower); elsewhere the table has tessera's columns only.
#
# Threads: tessera's THREADS argument (DeviceSpec::numThreads); libtorch's
# torch::set_num_threads with OPENBLAS_NUM_THREADS set to the same count.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-bench-release}
reps=${2:-5}
threads=${3:-$(nproc)}
[[ $build = /* ]] || build="$root/$build"

if [[ ! -f "$build/build.ninja" ]]; then
  meson setup "$build" "$root" --buildtype=release >/dev/null
fi
if ! ninja -C "$build" -t targets all | grep -q '^bench/tessera_bench_onnx_train:'; then
  echo "models.sh: this build has no tessera_bench_onnx_train (it needs libonnx-dev and libbenchmark-dev)" >&2
  exit 1
fi
ninja -C "$build" bench/tessera_bench_onnx_train >/dev/null
tessera="$build/bench/tessera_bench_onnx_train"
torch_include=/usr/include/torch/csrc/api/include
have_torch=0
if [[ -f $torch_include/torch/torch.h ]]; then
  have_torch=1
  mkdir -p "$build/peer"
  for model in lenet gpt; do
    g++ -O2 -std=c++17 "$root/bench/peer/torch_$model.cpp" -I"$torch_include" -ltorch -ltorch_cpu -lc10 \
      -o "$build/peer/torch_$model"
  done
fi

rate() { sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p'; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

n=$threads
if ((have_torch)); then
  echo "| model | batch | tessera 1 | libtorch 1 | tessera 1 / libtorch 1 | tessera $n | libtorch $n | tessera $n / libtorch $n | tessera $n / tessera 1 |"
  echo "|-------|------:|----------:|-----------:|-----------------------:|----------:|-----------:|-----------------------:|----------------------:|"
else
  echo "| model | batch | tessera 1 | tessera $n | tessera $n / tessera 1 |"
  echo "|-------|------:|----------:|----------:|----------------------:|"
fi
# Per model: name, tessera's model file, libtorch peer, range of the
# integer inputs (labels, tokens), batch, steps per run.
for spec in "LeNet|lenet|torch_lenet|10|${LENET_BATCH:-64}|30" "GPT block|gpt_block|torch_gpt|32|${GPT_BATCH:-64}|150"; do
  IFS='|' read -r name file peer classes batch steps <<<"$spec"
  peer=$build/peer/$peer
  t1=() tn=() p1=() pn=() r1=() rn=() s=()
  for ((i = 0; i < reps; ++i)); do
    t1+=("$("$tessera" "$root/tests/data/onnx/$file.onnx" "$batch" "$steps" 1 --classes "$classes" | rate)")
    if ((have_torch)); then
      p1+=("$(OPENBLAS_NUM_THREADS=1 "$peer" "$batch" "$steps" 1 | rate)")
      r1+=("$(ratio "${t1[-1]}" "${p1[-1]}")")
    fi
    tn+=("$("$tessera" "$root/tests/data/onnx/$file.onnx" "$batch" "$steps" "$n" --classes "$classes" | rate)")
    s+=("$(ratio "${tn[-1]}" "${t1[-1]}")")
    if ((have_torch)); then
      pn+=("$(OPENBLAS_NUM_THREADS=$n "$peer" "$batch" "$steps" "$n" | rate)")
      rn+=("$(ratio "${tn[-1]}" "${pn[-1]}")")
    fi
  done
  if ((have_torch)); then
    echo "| $name | $batch | $(median "${t1[@]}") | $(median "${p1[@]}") | $(median "${r1[@]}") | $(median "${tn[@]}") | $(median "${pn[@]}") | $(median "${rn[@]}") | $(median "${s[@]}") |"
  else
    echo "| $name | $batch | $(median "${t1[@]}") | $(median "${tn[@]}") | $(median "${s[@]}") |"
  fi
done
