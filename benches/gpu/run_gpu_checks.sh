#!/usr/bin/env bash
# On the GPU machine: install the wheel built here (`make wheel`, carried as wheels/), run the
# GPU-marked tests, then the correctness table of every workload (printed last).
#
#   bash benches/gpu/run_gpu_checks.sh            # full: batch 1/8/16
#   SMALL=1 bash benches/gpu/run_gpu_checks.sh    # small shapes only
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${MIRAGE_TARGET:-/tmp/mi}
rm -rf "$target"
python -m pip install -q --no-deps --target "$target" wheels/*.whl
export PYTHONPATH="$target" MIRAGE_CACHE_DIR=${MIRAGE_CACHE_DIR:-/tmp/mirage-cache}
out=${OUT:-/tmp}
python -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -5
if [ -n "${SMALL:-}" ]; then
    python benches/gpu/check_correctness.py --small --json "$out/check.json"
else
    python benches/gpu/check_correctness.py --json "$out/check.json"
fi
