#!/usr/bin/env bash
# Kernel tests and per-op checks/benchmarks on the H200; logs under $OUT, short tables at the end.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
run() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"; }
run pytest_kernels 200 python3 -m pytest src/hyserve/kernels -q -x -p no:cacheprovider
run gdn 110 python3 -m hyserve.kernels.gated_delta_rule.gpu_check
run small_ops 110 python3 -m hyserve.kernels.gpu_check_small_ops
run moe 130 python3 -m hyserve.kernels.moe.gpu_check
for f in pytest_kernels gdn small_ops moe; do echo "== tail $f"; tail -n 25 "$OUT/$f.log"; done
