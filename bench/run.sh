#!/usr/bin/env bash
# Measures the MLP 784-256-128-10 training step of tessera's simulated device
# against the same math hand-written in Eigen and against libtorch, all in one
# run so that the ratios share the machine's state, each on 1 thread and on
# THREADS threads (default: every CPU of the process); then tessera's scaling
# with the replica count, its host cost (set-up time, peak memory) for 1 to
# 1,024 replicas at a fixed global batch, tensor locations, and an R = 4 run
# split over 2 and 4 instances under `tessera launch` (needs Open MPI); last,
# the CNN and the transformer exported from PyTorch against libtorch
# (bench/models.sh).
#
#   bash bench/run.sh PEER_SOURCE_DIR [BUILD_DIR] [REPS] [THREADS]
#
# BATCHES (environment, default "8 64 256") lists the batches of the first
# table.
# PEER_SOURCE_DIR holds eigen_mlp.cpp and torch_mlp.cpp. BUILD_DIR (default
# build-bench-release) receives tessera's release build and the peer
# binaries. Each configuration runs REPS times (default 5); the table shows
# the median samples/s. Needs libeigen3-dev, libtorch-dev and
# libopenblas0-pthread (without OpenBLAS, Debian's libtorch falls back to the
# reference BLAS and is an order of magnitude slower).
#
# Build options:
#   tessera: meson --buildtype=release (-O3, NDEBUG), as scripts/run.sh builds
#            the main job: no -march=native (the GEMM kernels are chosen at
#            run time from the CPU)
#   Eigen:   g++ -O3 -march=native -DNDEBUG -fopenmp -std=c++17 (OpenMP makes
#            Eigen::setNbThreads use threads)
#   libtorch: g++ -O2 -std=c++17, linked against the installed libtorch
#
# Threads: tessera's THREADS argument (DeviceSpec::numThreads), Eigen's
# Eigen::setNbThreads, libtorch's torch::set_num_threads with
# OPENBLAS_NUM_THREADS set to the same count (Debian's libtorch runs its
# GEMMs in OpenBLAS, whose own pool ignores set_num_threads).
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: bash bench/run.sh PEER_SOURCE_DIR [BUILD_DIR] [REPS]" >&2
  exit 2
fi
peer=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-build-bench-release}
reps=${3:-5}
threads=${4:-$(nproc)}
[[ $build = /* ]] || build="$root/$build"

if [[ ! -f "$build/build.ninja" ]]; then
  meson setup "$build" "$root" --buildtype=release >/dev/null
fi
ninja -C "$build" bench/tessera_bench_mlp samples/tessera/tessera >/dev/null
mkdir -p "$build/peer"
g++ -O3 -march=native -DNDEBUG -fopenmp -std=c++17 "$peer/eigen_mlp.cpp" -I/usr/include/eigen3 -o "$build/peer/eigen_mlp"
g++ -O2 -std=c++17 "$peer/torch_mlp.cpp" -I/usr/include/torch/csrc/api/include -ltorch -ltorch_cpu -lc10 \
  -o "$build/peer/torch_mlp"

tessera="$build/bench/tessera_bench_mlp"
eigen="$build/peer/eigen_mlp"
torch="$build/peer/torch_mlp"

# Steps per run: about the same number of samples whatever the batch.
steps_for() { echo $((32000 / $1)); }

# Median samples/s of REPS runs of a command printing samples_per_s=N.
median() {
  local values=()
  for ((i = 0; i < reps; ++i)); do
    values+=("$("$@" | sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p')")
  done
  printf '%s\n' "${values[@]}" | sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# Medians of several commands (each one string), run in turn REPS times so
# that a change in the machine's load affects all of them alike; one line
# per command.
medians() {
  local -a values=()
  for ((i = 0; i < reps; ++i)); do
    for ((j = 1; j <= $#; ++j)); do
      values[j]+="$(eval "${!j}" | sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p') "
    done
  done
  for ((j = 1; j <= $#; ++j)); do
    printf '%s\n' ${values[j]} | sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
  done
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

n=$threads
echo "| batch | tessera 1 | tessera $n | Eigen 1 | Eigen $n | libtorch 1 | libtorch $n | tessera $n / libtorch $n | tessera $n / tessera 1 | tessera $n / Eigen $n |"
echo "|------:|----------:|-----------:|--------:|---------:|-----------:|------------:|-----------------:|----------------:|----------------:|"
for batch in ${BATCHES:-8 64 256}; do
  steps=$(steps_for "$batch")
  a1="$batch $steps 1 256 128"
  an="$batch $steps $n 256 128"
  mapfile -t m < <(medians "\"$tessera\" $a1" "\"$tessera\" $an" "OMP_NUM_THREADS=1 \"$eigen\" $a1" \
    "OMP_NUM_THREADS=$n \"$eigen\" $an" "OPENBLAS_NUM_THREADS=1 \"$torch\" $a1" \
    "OPENBLAS_NUM_THREADS=$n \"$torch\" $an")
  t1=${m[0]} tn=${m[1]} e1=${m[2]} en=${m[3]} p1=${m[4]} pn=${m[5]}
  echo "| $batch | $t1 | $tn | $e1 | $en | $p1 | $pn | $(ratio "$tn" "$pn") | $(ratio "$tn" "$t1") | $(ratio "$tn" "$en") |"
done

echo
echo "| tessera, global batch 64, $n threads | samples/s | vs R = 1 x 64 |"
echo "|--------------------------|----------:|--------------:|"
mapfile -t m < <(medians "\"$tessera\" 64 $(steps_for 64) $n 256 128" \
  "\"$tessera\" 8 $(steps_for 64) $n 256 128 --replicas 8")
one=${m[0]} eight=${m[1]}
echo "| R = 1 x batch 64 | $one | 1.00 |"
echo "| R = 8 x batch 8 | $eight | $(ratio "$eight" "$one") |"
echo
echo "| tessera, R = 4 x batch 16, $n threads | samples/s | vs plain replication |"
echo "|---------------------------|----------:|---------------------:|"
r4="\"$tessera\" 16 $(steps_for 64) $n 256 128 --replicas 4"
mapfile -t m < <(medians "$r4" "$r4 --rts" "$r4 --offchip-state" "$r4 --rts --offchip-state")
plain=${m[0]} rts=${m[1]} offchip=${m[2]} located=${m[3]}
echo "| plain replication | $plain | 1.00 |"
echo "| RTS (weights, momentum) | $rts | $(ratio "$rts" "$plain") |"
echo "| momentum OffChip | $offchip | $(ratio "$offchip" "$plain") |"
echo "| RTS (weights, momentum) + momentum OffChip | $located | $(ratio "$located" "$plain") |"
echo
# float16 (weights and activations stored as half, float32 master weights
# and momentum) against float32, the same step, 1 and n threads.
echo "| tessera, R = 1, float16 vs float32 | float32 samples/s | float16 samples/s | float16 / float32 |"
echo "|------------------------------------|------------------:|------------------:|------------------:|"
for batch in 64 256; do
  for t in 1 "$n"; do
    one="\"$tessera\" $batch $(steps_for "$batch") $t 256 128"
    mapfile -t m < <(medians "$one" "$one --float16")
    echo "| batch $batch, $t threads | ${m[0]} | ${m[1]} | $(ratio "${m[1]}" "${m[0]}") |"
  done
done

# Host cost by replica count at a fixed global batch of 4,096 samples (the
# main job's placement: weights and momentum sharded over all replicas, every
# tensor of 2 elements or more): samples/s, set-up time until the first step
# and peak resident memory of tessera_bench_mlp, each the median of REPS runs
# taken in turn; then `tessera train` of the main job's config for one epoch
# at the same global batch, test steps of 4,096 samples too (setupSeconds and
# samplesPerSecond of its JSON summary, peak resident memory from
# /usr/bin/time when installed).
rscale=(1 16 256 1024)
declare -A rscale_values=()
for ((i = 0; i < reps; ++i)); do
  for r in "${rscale[@]}"; do
    line=$("$tessera" $((4096 / r)) "$(steps_for 4096)" "$n" 256 128 --replicas "$r" --rts --rts-min-elements 2)
    for key in samples_per_s setup_s peak_rss_mb; do
      rscale_values[$r.$key]+="$(sed -n "s/.*$key=\([0-9.]*\).*/\1/p" <<<"$line") "
    done
  done
done
median_of() { printf '%s\n' $1 | sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo
echo "| tessera_bench_mlp, global batch 4096, RTS, $n threads | samples/s | vs R = 1 | set-up s | vs R = 1 | peak RSS MB | vs R = 1 |"
echo "|------|----------:|------:|------:|------:|------:|------:|"
for r in "${rscale[@]}"; do
  s=$(median_of "${rscale_values[$r.samples_per_s]}") t=$(median_of "${rscale_values[$r.setup_s]}")
  m=$(median_of "${rscale_values[$r.peak_rss_mb]}")
  [[ $r == 1 ]] && s1=$s t1=$t m1=$m
  echo "| R = $r x batch $((4096 / r)) | $s | $(ratio "$s" "$s1") | $t | $(ratio "$t" "$t1") | $m | $(ratio "$m" "$m1") |"
done

cli="$build/samples/tessera/tessera"
if [[ -x $cli ]]; then
  summary=$(mktemp)
  declare -A train_values=()
  for ((i = 0; i < reps; ++i)); do
    for r in "${rscale[@]}"; do
      replicated=$([[ $r -gt 1 ]] && echo true || echo false)
      train_cmd=("$cli" train samples/configs/mnist_rts.json --quiet --json-summary "$summary" --set /data/epochs=1
        --set "/sessionOptions/enableReplicatedGraphs=$replicated" --set "/sessionOptions/replicatedGraphCount=$r"
        --set "/data/batchSize=$((4096 / r))" --set "/data/testBatchSize=$((4096 / r))")
      if [[ -x /usr/bin/time ]]; then
        rss=$(cd "$root" && /usr/bin/time -f '%M' "${train_cmd[@]}" 2>&1 >/dev/null | tail -1)
        train_values[$r.rss]+="$(awk -v k="$rss" 'BEGIN {printf "%.1f", k / 1024}') "
      else
        (cd "$root" && "${train_cmd[@]}" >/dev/null)
      fi
      for key in setupSeconds samplesPerSecond; do
        train_values[$r.$key]+="$(sed -n "s/.*\"$key\": *\([0-9.e+-]*\).*/\1/p" <"$summary") "
      done
    done
  done
  rm -f "$summary"
  echo
  echo "| tessera train samples/configs/mnist_rts.json, global and test batch 4096, 1 epoch | samples/s | set-up s | vs R = 1 | peak RSS MB | vs R = 1 |"
  echo "|------|----------:|------:|------:|------:|------:|"
  for r in "${rscale[@]}"; do
    s=$(median_of "${train_values[$r.samplesPerSecond]}" | awk '{printf "%.0f", $1}')
    t=$(median_of "${train_values[$r.setupSeconds]}" | awk '{printf "%.3f", $1}')
    [[ $r == 1 ]] && t1=$t
    if [[ -n ${train_values[$r.rss]:-} ]]; then
      m=$(median_of "${train_values[$r.rss]}")
      [[ $r == 1 ]] && m1=$m
      echo "| R = $r x batch $((4096 / r)) | $s | $t | $(ratio "$t" "$t1") | $m | $(ratio "$m" "$m1") |"
    else
      echo "| R = $r x batch $((4096 / r)) | $s | $t | $(ratio "$t" "$t1") | - | - |"
    fi
  done
fi

# The main job as scripts/run.sh runs it (the same build), against the bench
# at its configuration: MLP 784-256-128-10, 2 replicas x batch 32, weights
# and momentum RTS; the CLI prints its throughput when it ends.
cli="$build/samples/tessera/tessera"
if [[ -x $cli ]]; then
  main_job() { (cd "$root" && "$cli" train samples/configs/mnist_rts.json 2>/dev/null) | sed -n 's/^throughput: \([0-9.]*\) samples\/s.*/samples_per_s=\1/p'; }
  mapfile -t m < <(medians "main_job" "\"$tessera\" 32 $(steps_for 64) 0 256 128 --replicas 2 --rts")
  echo
  echo "| main job (tessera train samples/configs/mnist_rts.json) | samples/s | vs tessera_bench_mlp 32 x R = 2, RTS |"
  echo "|------|----------:|------:|"
  echo "| tessera_bench_mlp | ${m[1]} | 1.00 |"
  echo "| main job | ${m[0]} | $(ratio "${m[0]}" "${m[1]}") |"
fi

# The same run split over instances under `tessera launch` (mpirun): instance 0 prints the line.
if "$build/samples/tessera/tessera" launch --num-replicas 1 --num-instances 1 -- true 2>/dev/null; then
  # THREADS 0: each instance takes its share of the CPUs from the launcher.
  launch=("$build/samples/tessera/tessera" launch --num-replicas 4 --timeout 60)
  two=$(median "${launch[@]}" --num-instances 2 -- "$tessera" 16 "$(steps_for 64)" 0 256 128)
  four=$(median "${launch[@]}" --num-instances 4 -- "$tessera" 16 "$(steps_for 64)" 0 256 128)
  echo
  echo "| tessera, R = 4 x batch 16 | samples/s | vs 1 instance |"
  echo "|---------------------------|----------:|--------------:|"
  echo "| 1 instance x 4 replicas | $plain | 1.00 |"
  echo "| 2 instances x 2 replicas | $two | $(ratio "$two" "$plain") |"
  echo "| 4 instances x 1 replica | $four | $(ratio "$four" "$plain") |"
fi

# The CNN and the transformer exported from PyTorch (tests/data/onnx) against
# the same modules in libtorch (bench/peer/), on 1 and THREADS threads.
echo
bash "$root/bench/models.sh" "$build" "$reps" "$n"
