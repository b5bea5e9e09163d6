#!/usr/bin/env bash
# Times `tessera explain` of GPT-3's shape (96 layers, hidden 12288, 96 heads,
# sequence 2048: 174.6 B weights) on the GPT-2 XL sample's settings at 64, 256
# and 1,024 replicas: wall time and peak host memory of the text and JSON
# reports, their size in lines and bytes, and the same for `validate` (one
# plan, no levers). Planning and reporting should cost the same at every
# replica count (DESIGN.md section 8): replicas alike are planned and shown
# once.
#
#   bash bench/explain_scaling.sh [BUILD_DIR] [REPLICAS...]
#
# BUILD_DIR (default build) holds a built tessera; REPLICAS default to
# 64 256 1024. Prints a Markdown table (the one in bench/RESULTS.md): CPU
# seconds (wall seconds in parentheses) and peak resident memory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
shift || true
replicas=("$@")
((${#replicas[@]})) || replicas=(64 256 1024)
tessera=$build/samples/tessera/tessera
[[ -x $tessera ]] || { echo "explain_scaling: $tessera is not built" >&2; exit 2; }
config=samples/configs/gpt2_xl_pod64.json
shape=(--set /model/layers=96 --set /model/hidden=12288 --set /model/heads=96 --set /model/sequence=2048)
# The sample's layout before it fit: one float32 IPU per replica, weights and
# optimizer state sharded over Consecutive(16) through the IO tiles.
shape+=(--set /device/ipusPerReplica=1 --set /sessionOptions/virtualGraphMode=Off --set /model/dtype=float32
  --set '/sessionOptions/weightTensorLocationSettings/location/shardingDomain={"type": "Consecutive", "replicaGroupSize": 16}'
  --set '/sessionOptions/optimizerStateTensorLocationSettings/location/shardingDomain={"type": "Consecutive", "replicaGroupSize": 16}'
  --set /sessionOptions/optimizerStateTensorLocationSettings/location/loadTileSet=IO
  --set /sessionOptions/optimizerStateTensorLocationSettings/location/storageTileSet=IO)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# "CPU_SECONDS WALL_SECONDS KB" of one command (CPU: user + system, which
# other processes on a shared machine disturb less than wall time); its stdout
# goes to $out/stdout. Exit status 4 (the program does not fit the device) is
# the expected answer here.
measure() {
  local status=0
  /usr/bin/time -f '%U %S %e %M' -o "$out/time" "$@" >"$out/stdout" 2>/dev/null || status=$?
  ((status == 0 || status == 4)) || { echo "explain_scaling: $* exited with $status" >&2; exit 1; }
  # The last line, after "Command exited with non-zero status 4".
  tail -n 1 "$out/time" | awk '{ printf "%.2f %s %s\n", $1 + $2, $3, $4 }'
}

echo "| replicas | validate | explain (text) | lines | explain --json | JSON |"
echo "|---|---|---|---|---|---|"
for r in "${replicas[@]}"; do
  args=("$config" "${shape[@]}" --set "/sessionOptions/replicatedGraphCount=$r")
  read -r vs vw vk < <(measure "$tessera" validate "${args[@]}")
  # The report, not the search for levers (--lever-plans 0).
  read -r ts tw tk < <(measure "$tessera" explain "${args[@]}" --lever-plans 0)
  lines=$(wc -l <"$out/stdout")
  read -r js jw jk < <(measure "$tessera" explain "${args[@]}" --json --lever-plans 0)
  bytes=$(wc -c <"$out/stdout")
  printf '| %s | %s s (%s s), %s MB | %s s (%s s), %s MB | %s | %s s (%s s), %s MB | %s MB |\n' "$r" "$vs" "$vw" \
    "$((vk / 1024))" "$ts" "$tw" "$((tk / 1024))" "$lines" "$js" "$jw" "$((jk / 1024))" \
    "$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }')"
done
