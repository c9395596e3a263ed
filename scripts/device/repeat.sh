#!/usr/bin/env bash
# The same greedy request again and again on one engine, bit for bit (scripts/check_repeat.py), with the KV
# cache at KVGBS' sizes (GiB, "3 8": the H100 tuner run's first request differed from the later ones at 3).
# ~1.5 min a size from a warm Triton cache. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
for gb in ${KVGBS:-3 8}; do
  TAILN=${TAILN:-40} run "repeat-kv$gb" 300 python3 scripts/check_repeat.py --model $M --load-format dummy \
    --kv-cache-memory-gb "$gb" --max-num-seqs 8 --max-model-len 8192
done
