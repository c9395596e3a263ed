#!/usr/bin/env bash
# Time to first token and decode through HTTP, before against after, on one machine: `hyserve serve` (serve_bench.sh's
# flags) on .base/src (the "before" side: `git archive <commit> src | tar -x -C .base`, carried) and on the tree,
# alternated twice, each answering `hyserve bench` ttft (REPS a length, 10) and decode. Between machines the HTTP
# TTFT moves by ~1 ms (2026-12-05), more than most single changes. Carry .whl and .base.
set -u
source "$(dirname "$0")/common.sh"
PORT=8011
one() {
  local name=$1 src=$2
  PYTHONPATH=/tmp/site:$src start_server $PORT "$OUT/server_$name.log" --max-num-seqs 48 --max-model-len 8192 \
    --gpu-memory-utilization 0.95 || return 1
  for s in ttft decode; do
    timeout 200 python3 -m hyserve bench --url "http://127.0.0.1:$PORT" --model-dir $M --gpu h200 --no-progress \
      --out "$OUT/b_${name}_$s" --scenario $s --ttft-reps "${REPS:-10}" > "$OUT/b_${name}_$s.log" 2>&1
    echo "== $name $s rc=$?"; grep -E "^(ttft|decode) " "$OUT/b_${name}_$s.log" | cut -c1-120
  done
  kill -TERM $SERVER_PID; wait $SERVER_PID
}
one after1 src; one before1 .base/src; one after2 src; one before2 .base/src
