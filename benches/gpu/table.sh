#!/usr/bin/env bash
# On the GPU machine: install the wheel built here (`make wheel`, carried as wheels/), then one
# part of BENCHMARKS.md section 5's table with fresh searches, each cell's winner saved:
# $OUT/NAME.json (bench.py --json), $OUT/NAME.log, and the winners as one $OUT/NAME-graphs.tgz
# (the device tool returns at most 8 files). Merge the parts here with merge_tables.py.
#
#   bash benches/gpu/table.sh att1 --batches 1 --only gqa,qknorm_gqa,mha,mqa
#   bash benches/gpu/table.sh att816 --batches 8,16 --only gqa,qknorm_gqa,mha,mqa \
#       --contenders eager,sdpa,compile_sdpa
#   bash benches/gpu/table.sh mlp --batches 1,8,16 \
#       --only rmsnorm_linear,rmsnorm_linear_6144,gated_mlp,lora,ntrans
#
# The whole table in one run (about 700 s with every search fresh, past the device's 600 s a
# call): with CACHED=1 the searches go through the on-disk cache, so a first call fills it with
# the attention cells and a second, on the same warm machine, runs all 27 (273 s):
#   CACHED=1 bash benches/gpu/table.sh att --only gqa,qknorm_gqa,mha,mqa \
#       --large-attention-contenders eager,sdpa,compile_sdpa
#   CACHED=1 bash benches/gpu/table.sh all --large-attention-contenders eager,sdpa,compile_sdpa
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
graphs="$out/$name-graphs"
fresh=--no-cache
[ "${CACHED:-0}" = 1 ] && fresh=
python3 benches/gpu/bench.py $fresh --resources --json "$out/$name.json" \
    --save-graphs "$graphs" "$@" 2>&1 | tee "$out/$name.log"
status=${PIPESTATUS[0]}
if [ -d "$graphs" ]; then
    tar czf "$graphs.tgz" -C "$out" "$name-graphs" && rm -rf "$graphs"
fi
exit "$status"
