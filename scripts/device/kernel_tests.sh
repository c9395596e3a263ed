#!/usr/bin/env bash
# The whole kernel suite on the H200 at real shapes in one device call: three pytest processes at once
# (moe / linear / every other kernel folder; one process takes longer than a call's 10 minutes from a cold
# Triton cache, three took 410 s at ee3574d). Prints each process's counts and its first failures.
set -u
source "$(dirname "$0")/common.sh"
K=src/hyserve/kernels
rest=$(ls -d $K/*/ $K/test_*.py | grep -v -e "/moe/" -e "/linear/")
s=$SECONDS
timeout 540 python3 -m pytest -p no:cacheprovider -rfE $K/moe > "$OUT/t_moe.log" 2>&1 &
timeout 540 python3 -m pytest -p no:cacheprovider -rfE $K/linear > "$OUT/t_linear.log" 2>&1 &
timeout 540 python3 -m pytest -p no:cacheprovider -rfE $rest > "$OUT/t_rest.log" 2>&1 &
rc=0
for job in $(jobs -p); do wait "$job" || rc=1; done
echo "kernel tests took $((SECONDS - s)) s"
for f in moe linear rest; do
  echo "== $f: $(grep -E '(passed|failed|error)' "$OUT/t_$f.log" | tail -n 1)"
  grep -E "^(FAILED|ERROR)" "$OUT/t_$f.log" | head -n 5
done
exit $rc
