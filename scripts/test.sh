#!/usr/bin/env bash
# Sets up, builds with warnings as errors and runs every test suite, then
# prints one line "tests: N passed, M failed" (see count-tests.py). Exits
# non-zero when anything failed.
#
#   bash scripts/test.sh [--build-dir DIR] [-Dname=value]... [-- MESON_TEST_ARGUMENT...]
#
# e.g. `bash scripts/test.sh -- --suite lib`. TESSERA_COUNT_LABEL replaces the
# "tests" of the count line (.ci/run does, so that its total is the only one).
set -euo pipefail

build_dir=${TESSERA_BUILD_DIR:-build}
setup_args=()
test_args=()
while (($#)); do
  case $1 in
    --build-dir) build_dir=${2:?--build-dir needs a folder}; shift 2 ;;
    --build-dir=*) build_dir=${1#*=}; shift ;;
    --) shift; test_args=("$@"); break ;;
    -h|--help) sed -n '2,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) setup_args+=("$1"); shift ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A log left by an earlier run must not be counted when this build fails.
log=$build_dir/meson-logs/testlog.json
rm -f "$log"

status=0
bash scripts/setup.sh --build-dir "$build_dir" -Dwerror=true "${setup_args[@]}" || status=$?
if ((status == 0)); then
  meson test -C "$build_dir" --print-errorlogs "${test_args[@]}" || status=$?
fi
python3 scripts/count-tests.py --label "${TESSERA_COUNT_LABEL:-tests}" "$log" || { ((status)) || status=1; }
exit "$status"
