#!/usr/bin/env bash
# Is the HTTP part of the time to first token the host's idle wake-ups? `hyserve serve` on dummy weights, then
# `hyserve bench --scenario ttft` alternated ROUNDS (2) times plain and with one SCHED_IDLE busy loop per core
# (they keep every core out of its idle states and yield at once to any other thread). Each bench's mean
# time to first token as the server saw it (from /metrics: the handler's arrival to the engine's first token)
# is printed beside the client's. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
PORT=8013
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
echo "governor: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2> /dev/null || echo none)"
for s in /sys/devices/system/cpu/cpu0/cpuidle/state*; do
  [ -d "$s" ] && echo "idle state $(cat $s/name): exit latency $(cat $s/latency) us, disabled $(cat $s/disable)"
done
start_server $PORT "$OUT/server.log" --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 || exit 1
pid=$SERVER_PID
ttft_server() {  # "sum count" of the server's TTFT histogram
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
    | awk '/^hyserve:time_to_first_token_seconds_sum/ {s = $2} /^hyserve:time_to_first_token_seconds_count/ {n = $2}
           END {print s, n}'
}
bench() {  # $1: label
  local before after
  before=$(ttft_server)
  timeout 200 python3 -m hyserve bench --url "http://127.0.0.1:$PORT" --model-dir $M --gpu h200 --no-progress \
    --out "$OUT/bench_$1" --scenario ttft --ttft-reps "${REPS:-10}" > "$OUT/bench_$1.log" 2>&1
  after=$(ttft_server)
  echo "== $1"; tail -n 5 "$OUT/bench_$1.log" | cut -c1-110
  python3 -c "b='$before'.split(); a='$after'.split(); s=float(a[0])-float(b[0]); n=float(a[1])-float(b[1]);
print(f'   server-side TTFT mean over all lengths: {1e3 * s / n:.2f} ms ({n:.0f} requests)')"
}
SPIN=()
spin() { for _ in $(seq 1 "$(nproc)"); do chrt --idle 0 python3 -c "while True: pass" & SPIN+=($!); done; sleep 1; }
bench warm
for r in $(seq 1 "${ROUNDS:-2}"); do
  bench "plain_$r"
  spin; bench "spin_$r"; kill "${SPIN[@]}"; wait "${SPIN[@]}" 2> /dev/null; SPIN=()
done
kill -TERM $pid; wait $pid
