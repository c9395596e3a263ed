#!/usr/bin/env bash
# TTFT through HTTP with uvicorn's pure-Python stack (asyncio loop, h11) against uvloop + httptools (what
# `uvicorn[standard]` adds), alternated ROUNDS (2) times: `hyserve serve` on dummy weights, `hyserve bench
# --scenario ttft`. The pure-Python rounds hide both modules behind stubs that raise ImportError (the device
# image may have uvloop of its own), so uvicorn's "auto" falls back. Carry .whl with the uvloop and httptools
# wheels (`../shared/tools/gpu-wheels uvloop httptools`).
set -u
source "$(dirname "$0")/common.sh"
PORT=8012
mkdir -p /tmp/noext/uvloop /tmp/noext/httptools
for m in uvloop httptools; do echo "raise ImportError('hidden by http_stack.sh')" > /tmp/noext/$m/__init__.py; done
stack() { python3 - << 'PY'
def has(name):
    try:
        __import__(name)
        return name
    except ImportError:
        return "no " + name
print(has("uvloop"), has("httptools"))
PY
}
serve_ttft() {  # $1: label
  echo "== $1: $(stack)"
  start_server $PORT "$OUT/server_$1.log" --max-model-len 8192 --gpu-memory-utilization 0.97 --max-num-seqs 8 || return
  local pid=$SERVER_PID
  timeout 200 python3 -m hyserve bench --url "http://127.0.0.1:$PORT" --model-dir $M --gpu h200 --no-progress \
    --out "$OUT/bench_$1" --scenario ttft --ttft-reps "${REPS:-10}" > "$OUT/bench_$1.log" 2>&1
  echo "rc=$?"; tail -n 6 "$OUT/bench_$1.log"
  kill -TERM $pid; wait $pid
}
PLAIN=$PYTHONPATH
for r in $(seq 1 "${ROUNDS:-2}"); do
  export PYTHONPATH=/tmp/noext:$PLAIN; serve_ttft "h11_$r"
  export PYTHONPATH=$PLAIN; serve_ttft "uvloop_$r"
done
