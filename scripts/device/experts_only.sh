#!/usr/bin/env bash
# `--mma-experts-only` (the experts' bf16 weights released once their 12-bit copies exist: the model in ~54 GB, so it
# fits an H100 too) on whichever card comes (carry .whl). PART=1 (default): the GPU tests of the copies-only MoE and of
# the kernels it routes to, then the issue-4 HTTP table with the flag at full size on either card (serve_bench.sh;
# the tests warmed part of the Triton cache), ~8 min.
# PART=2: `hyserve verify` with the flag (H200: full size; H100: at 16 layers against --mma-experts, since verify's
# transformers model unpacks the released experts into new bf16 tensors and the full model's 64 GB of them fit an
# H200 only), then the first token without HTTP at 128 / 1024 / 4096 tokens, bf16 experts against --mma-experts
# against --mma-experts-only (ab_prefill.sh; on an H100 at 16 layers, where the bf16 model and the copies fit), ~8 min.
# PART=3: the tests, then PART=2 without the bf16 side and at 1024 / 4096 tokens only, ~9 min.
set -u
source "$(dirname "$0")/common.sh"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
tests() {
  timeout 200 python3 -m pytest -p no:cacheprovider -rfE src/hyserve/kernels/moe/test_mma_grouped.py \
    src/hyserve/kernels/moe/test_mma_pairs.py tests/test_mma_experts_only.py -k "${TESTS_K:-not nothing}" \
    > "$OUT/t_only.log" 2>&1
  echo "tests rc=$? $(grep -E '(passed|failed|error)' "$OUT/t_only.log" | tail -n 1)"
  grep -E "^(FAILED|ERROR)" "$OUT/t_only.log" | head -n 5
}
[ "${PART:-1}" = 3 ] && TESTS_K="only_the_copies or one_token_over_the_copies or keep_the_bf16 or copies_alone" tests  # the rest passed at ff60887
if [ "${PART:-1}" != 1 ]; then
  if [ "$mem" -gt 100000 ]; then
    TAILN=8 run verify 300 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
      --max-num-seqs 8 --max-model-len 4096 --paths fast --mma-experts-only
  else
    FLAGS=--mma-experts-only CMP_FLAGS=--mma-experts bash "$(dirname "$0")/verify_depth.sh" 2>&1 | tail -n 20
    export LAYERS=16
  fi
  [ "$PART" = 3 ] && export SIDES="mma:src:--mma-experts only:src:--mma-experts-only" LENS=1024,4096
  SIDES=${SIDES:-"bf16:src:--no-mma-experts-only mma:src:--mma-experts only:src:--mma-experts-only"} ROUNDS=1 REPS=5 TOP=6 KVGB=4 \
    LENS=${LENS:-128,1024,4096} bash "$(dirname "$0")/ab_prefill.sh" 2>&1 | tail -n 60
  exit
fi
tests
echo "Triton cache before the start: $(find ~/.triton/cache -type f 2> /dev/null | wc -l) files"
bash "$(dirname "$0")/serve_bench.sh" --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
  --mma-experts-only 2>&1 | grep -v "^hyserve:" | tail -n 40
