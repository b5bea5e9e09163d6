#!/usr/bin/env bash
# The host cost of a pipelined run against the same run without pipelining:
# `tessera train` of a sample with gradient accumulation over 7
# micro-batches, once as it is and once pipelined over 4 IPUs
# (virtualGraphMode Auto, enablePipelining), STEPS steps each, the rounds
# interleaved. Pipelining changes the program's schedule, the memory plan
# (stashes) and the time model (cycles), not the numbers, so the host should
# pay about the same: the target is at most 1.2x.
#
#   [STEPS=16] bash bench/pipeline_host_cost.sh [BUILD_DIR] [ROUNDS] [CONFIG...]
#
# BUILD_DIR (default build) holds a built tessera; ROUNDS default to 5;
# CONFIG defaults to samples/configs/gpt_tiny.json and
# samples/configs/lenet.json. Prints a Markdown table (the one in
# bench/RESULTS.md): median CPU seconds (user + system, which other processes
# on a shared machine disturb less than wall time) and peak resident memory of
# each, and the ratio.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
rounds=${2:-5}
steps=${STEPS:-16}
shift 2 || shift $# || true
configs=("$@")
((${#configs[@]})) || configs=(samples/configs/gpt_tiny.json samples/configs/lenet.json)
tessera=$build/samples/tessera/tessera
[[ -x $tessera ]] || { echo "pipeline_host_cost: $tessera is not built" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# "CPU_SECONDS KB" of one command.
measure() {
  /usr/bin/time -f '%U %S %M' -o "$out/time" "$@" >/dev/null 2>"$out/stderr" ||
    { echo "pipeline_host_cost: $* failed:" >&2; cat "$out/stderr" >&2; exit 1; }
  tail -n 1 "$out/time" | awk '{ printf "%.3f %s\n", $1 + $2, $3 }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "| config | accumulation run | pipelined over 4 IPUs | ratio |"
echo "|---|---|---|---|"
for config in "${configs[@]}"; do
  batch=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["data"]["batchSize"])' "$config")
  common=(--set /sessionOptions/enableGradientAccumulation=true --set /sessionOptions/accumulationFactor=7
          --set /data/epochs=1 --set "/data/limitTrainSamples=$((steps * 7 * batch))")
  piped=(--set /sessionOptions/virtualGraphMode=Auto --set /device/ipusPerReplica=4
         --set /sessionOptions/enablePipelining=true)
  : >"$out/plain"
  : >"$out/piped"
  for ((r = 0; r < rounds; ++r)); do
    measure "$tessera" train "$config" "${common[@]}" >>"$out/plain"
    measure "$tessera" train "$config" "${common[@]}" "${piped[@]}" >>"$out/piped"
  done
  ps=$(cut -d' ' -f1 "$out/plain" | median)
  pk=$(cut -d' ' -f2 "$out/plain" | median)
  qs=$(cut -d' ' -f1 "$out/piped" | median)
  qk=$(cut -d' ' -f2 "$out/piped" | median)
  printf '| %s | %s s, %s MB | %s s, %s MB | %s |\n' "$(basename "$config")" "$ps" "$((${pk%.*} / 1024))" "$qs" \
    "$((${qk%.*} / 1024))" "$(awk -v a="$qs" -v b="$ps" 'BEGIN { printf "%.2fx", a / b }')"
done
