#!/usr/bin/env bash
# TTFT through HTTP with uvicorn's pure-Python stack (asyncio loop, h11) against uvloop + httptools (what
# `uvicorn[standard]` adds), alternated ROUNDS (2) times: `hyserve serve` on dummy weights, `hyserve bench
# --scenario ttft`. Carry .whl with the uvloop and httptools wheels (`../shared/tools/gpu-wheels uvloop httptools`).
set -u
source "$(dirname "$0")/common.sh"
PORT=8012
serve_ttft() {  # $1: label
  start_server $PORT "$OUT/server_$1.log" --max-model-len 8192 || return
  local pid=$SERVER_PID
  timeout 200 python3 -m hyserve bench --url "http://127.0.0.1:$PORT" --model-dir $M --gpu h200 --no-progress \
    --out "$OUT/bench_$1" --scenario ttft --ttft-reps "${REPS:-10}" > "$OUT/bench_$1.log" 2>&1
  echo "== $1 rc=$?"; tail -n 7 "$OUT/bench_$1.log"
  kill -TERM $pid; wait $pid
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  rm -rf /tmp/site/uvloop* /tmp/site/httptools*
  python3 -c "import uvloop" 2> /dev/null && echo "uvloop still importable"
  serve_ttft "h11_$r"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/uvloop*.whl .whl/httptools*.whl \
    > /dev/null 2>&1
  python3 -c "import uvloop, httptools" && serve_ttft "uvloop_$r"
done
