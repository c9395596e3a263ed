#!/usr/bin/env bash
# The issue-4 table through HTTP on the H200: start `hyserve serve` on dummy weights (start-up timed, graph
# capture included), then `hyserve bench` decode (128 in, 512 out), ttft (128/1024/4096) and throughput
# (128 requests, 32 in flight, 1024 in, 512 out). Needs the server wheels: carry .whl (README "On the H200").
# usage: bash scripts/device/serve_bench.sh [extra hyserve serve flags]; DECODE_ONLY=1: the decode scenario only
set -u
source "$(dirname "$0")/common.sh"  # PYTHONPATH with the server wheels, $OUT, $M
PORT=8011
t0=$(date +%s%N)
start_server $PORT "$OUT/server.log" "$@" || exit 1
pid=$SERVER_PID
echo "server ready after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
grep -E "model ready|graph capture took|cache:" "$OUT/server.log"
bench() {
  local name=$1; shift
  timeout 300 python3 -m hyserve bench --url "http://127.0.0.1:$PORT" --model-dir $M --gpu h200 \
    --no-progress --out "$OUT/bench_$name" "$@" > "$OUT/bench_$name.log" 2>&1
  echo "== bench $name rc=$?"; tail -n 8 "$OUT/bench_$name.log"
}
bench decode --scenario decode
[ -n "${DECODE_ONLY:-}" ] && { kill -TERM $pid; wait $pid; exit 0; }
bench ttft --scenario ttft --ttft-reps 5
echo "== ttft split (means, ms: the client, the server's arrival -> token, its prefill step)"
timeout 120 python3 scripts/ttft_split.py --url "http://127.0.0.1:$PORT" --reps 10 2>&1 | tail -n 4
steps() {  # the engine-step histograms of /metrics (cumulative): where the time of a run went
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
    | grep -E "^hyserve:iteration_(seconds|tokens)_(sum|count)" | sed 's/{model_name="[^"]*",/{/; s/^hyserve://'
}  # without the "hyserve:" prefix: the callers' `grep -v "^hyserve:"` (the CLI's log lines) would drop them
echo "== engine steps before c32"; steps
bench c32 --scenario throughput --concurrency 32 --num-prompts 128 --warmup 0
echo "== engine steps after c32"; steps
kill -TERM $pid; wait $pid
echo "server exit rc=$?"
