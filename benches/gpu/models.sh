#!/usr/bin/env bash
# On the GPU machine: install the wheel built here (`make wheel`, carried as wheels/), then the
# model-shaped suite (models.py) with its results in $OUT, rewritten after every cell:
# $OUT/NAME.json (raw), $OUT/NAME.md (the table), $OUT/NAME-graphs.json (the winners) and
# $OUT/NAME.log. The run stops itself LIMIT seconds (default 570) after it starts, keeping
# every finished cell; pass --time-budget to skip cells that would not finish in time.
#
#   bash benches/gpu/models.sh m1 --shard 1/2 --time-budget 520 --search-budget 30
#   bash benches/gpu/models.sh m2 --shard 2/2 --time-budget 520 --search-budget 30
#   python benches/gpu/models.py --merge m1.json m2.json --write-md BENCHMARKS.md   # anywhere
set -uo pipefail
cd "$(dirname "$0")/../.."
name=$1
shift
out=${OUT:-/tmp}
target=${MIRAGE_TARGET:-/tmp/mi}
rm -rf "$target"
python3 -m pip install -q --no-deps --target "$target" wheels/*.whl || exit 1
export PYTHONPATH="$target" MIRAGE_CACHE_DIR=${MIRAGE_CACHE_DIR:-/tmp/mirage-cache} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader || true
timeout -s INT -k 15 "${LIMIT:-570}" python3 benches/gpu/models.py --json "$out/$name.json" \
    --md "$out/$name.md" --save-graphs "$out/$name-graphs.json" "$@" 2>&1 | tee "$out/$name.log"
exit "${PIPESTATUS[0]}"
