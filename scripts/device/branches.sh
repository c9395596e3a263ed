#!/usr/bin/env bash
# The grouped-kernel branches against main, from a main checkout, in one call (~5-6 min): `moe.bench`'s grouped rows
# on main's src, `grouped-prologue` (the first weight chunk asked for before the block's rows), `grouped-rt` (RT tiles
# a warp in turn) and `grouped-persistent` (the 40th session's persistent grid, with main's L2 lookahead; its GPU
# tests first), alternated twice, then the fused gate_up + down of
# `grouped-fused` (`moe.bench --mma-fused`: two kernels / fused / Triton), then, while BUDGET (560) seconds allow,
# serve_bench.sh on main (the HTTP table with ttft_split.py). On the H100 (2026-12-07) none of them gained; the H200,
# whose down is further from its floor, is where they are owed. Prepare .br with the loop in owed.sh's header (this is
# its PART=3), then carry .whl and .br.
set -u
source "$(dirname "$0")/common.sh"
for b in grouped-prologue grouped-rt grouped-persistent grouped-fused; do
  [ -d .br/$b/src ] || { echo "missing .br/$b/src (see the header)"; exit 1; }
done
P=.br/grouped-persistent/src
TAILN=2 run persistent_tests 200 env PYTHONPATH=/tmp/site:$P python3 -m pytest -q -x \
  $P/hyserve/kernels/moe/test_mma_grouped.py -k "persistent or rejects_unsupported_wgmma"
ROUNDS=2 TOKENS=512,1024 PREFILL_BY=0 \
  SIDES="main:src prologue:.br/grouped-prologue/src:(4,1,1),(8,1,1) rt:.br/grouped-rt/src:(4,2,1),(8,2,1),(8,1,1) persist:$P:(4,1,1,4),(8,1,1,2)" \
  bash "$(dirname "$0")/grouped_ab.sh" > $OUT/grouped_ab.log 2>&1
echo "== fused" | tee -a $OUT/bench.txt
PYTHONPATH=/tmp/site:.br/grouped-fused/src timeout 150 python3 -m hyserve.kernels.moe.bench --mma-fused \
  --tokens 512,1024 2>&1 | grep -E "^T=|rror" | tee -a $OUT/bench.txt > /dev/null
if [ $SECONDS -lt $((${BUDGET:-560} - 150)) ]; then
  bash "$(dirname "$0")/serve_bench.sh" --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
    > $OUT/serve.log 2>&1
  grep -A 4 -E "^== bench ttft|^== ttft split" $OUT/serve.log | grep -v "^hyserve:"
else
  echo "serve_bench: skipped at ${SECONDS} s"
fi
echo "== tests"; tail -n 2 $OUT/tests.log  # grouped_ab.sh logs its runs under $OUT
echo "== summary (us a layer)"
sed 's/ of its bytes.*rel err/ rel/' $OUT/bench.txt | grep -E "^==|wgmma|persist|fused|two"
