#!/usr/bin/env bash
# One-off (2026-12-03): where the 1024-token prefill's kernel time goes; the B=1 decode step at the
# server's shapes (max-model-len 8192, contexts ~384-450); the LM head GEMV with TMA against without.
set -u
source "$(dirname "$0")/common.sh"
P="python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32"
TAILN=40 run prefill 200 python3 scripts/profile_prefill.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192 --prompt-lens 1024,128 --reps 3 --top 40
TAILN=4 run base 120 $P --max-model-len 4096 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup
TAILN=4 run long 120 $P --max-model-len 8192 --prompt-len 384 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup
python3 - <<'PY'
import json
p = "src/hyserve/kernels/linear/configs/gemv.json"
d = json.load(open(p))
d["plans"]["248320x2048"] = {"BLOCK_N": 8, "BLOCK_K": 256, "num_warps": 4, "TMA": 4}
json.dump(d, open(p, "w"), indent=1)
PY
TAILN=4 run lmtma 120 $P --max-model-len 4096 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup
git checkout src/hyserve/kernels/linear/configs/gemv.json
for f in base long lmtma; do echo "== $f"; sed -n '/== batch 1:/,/^$/p' $W/$f.log | head -n 14; done
tar czf "$OUT/results.tgz" -C $W .
