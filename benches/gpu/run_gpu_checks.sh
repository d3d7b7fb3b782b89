#!/usr/bin/env bash
# On the GPU machine: install the wheel built here (`make wheel`, carried as wheels/), run the
# GPU-marked tests, then the correctness table of every workload (printed last).
#
#   bash benches/gpu/run_gpu_checks.sh            # full: batch 1/8/16
#   SMALL=1 bash benches/gpu/run_gpu_checks.sh    # small shapes only
#   BENCH=1 bash benches/gpu/run_gpu_checks.sh    # then the side-by-side benchmark (bench.py):
#                                                 # $OUT/bench.json and $OUT/bench.md; extra
#                                                 # arguments in BENCH_ARGS (e.g. "--quick")
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${MIRAGE_TARGET:-/tmp/mi}
rm -rf "$target"
python -m pip install -q --no-deps --target "$target" wheels/*.whl
export PYTHONPATH="$target" MIRAGE_CACHE_DIR=${MIRAGE_CACHE_DIR:-/tmp/mirage-cache}
out=${OUT:-/tmp}
# Every GPU-marked test, in JOBS processes (pytest-xdist; the tests are mostly NVRTC-bound).
python -m pytest -q -m gpu tests -p no:cacheprovider -n "${JOBS:-4}" 2>&1 | tail -5
status=0
if [ -n "${SMALL:-}" ]; then
    python benches/gpu/check_correctness.py --small --json "$out/check.json" || status=$?
else
    python benches/gpu/check_correctness.py --json "$out/check.json" || status=$?
fi
if [ -n "${BENCH:-}" ]; then
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
    python benches/gpu/bench.py --json "$out/bench.json" --write-md "$out/bench.md" \
        ${BENCH_ARGS:-} || status=$?
fi
exit "$status"
