#!/usr/bin/env bash
# One call (~7 min): the persistent-GEMV probe where it isolates the boundary (tiny GEMVs) and with wider tiles
# (more loads in flight per program); then the whole kernel test suite on the H200 in three parallel pytest
# processes (moe / linear / the rest), each with its pass/fail line. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
for args in "--shape 256x512 --block-k 512 --programs-per-sm 1" "--shape 256x512 --block-k 512 --programs-per-sm 4" \
    "--block-n 1 --block-k 4096 --programs-per-sm 4" "--block-n 2 --block-k 4096 --programs-per-sm 4" \
    "--block-n 4 --block-k 2048 --programs-per-sm 4" "--block-n 1 --block-k 4096 --programs-per-sm 8"; do
  echo "== probe $args"; timeout 60 python3 scripts/probe_persistent_gemv.py --layers 40 $args 2>&1 | tail -4
done
K=src/hyserve/kernels
rest=$(ls -d $K/*/ $K/test_*.py | grep -v -e "/moe/" -e "/linear/")
s=$SECONDS
timeout 420 python3 -m pytest -q -p no:cacheprovider $K/moe > $W/t_moe.log 2>&1 &
timeout 420 python3 -m pytest -q -p no:cacheprovider $K/linear > $W/t_linear.log 2>&1 &
timeout 420 python3 -m pytest -q -p no:cacheprovider $rest > $W/t_rest.log 2>&1 &
wait
echo "tests took $((SECONDS - s)) s"
for f in moe linear rest; do echo "== $f: $(tail -n 1 $W/t_$f.log)"; grep -E "^FAILED|^ERROR" $W/t_$f.log | head -5; done
