#!/usr/bin/env bash
# Where the 12-bit grouped wgmma kernels of a prefill (`moe/mma_grouped_cuda.py`, `grouped_wgmma`) spend their time:
# `moe.bench`'s grouped rows (gate_up, down + sum; the Triton bf16 plan beside them) at TOKENS on src and on copies
# of it with one part of the chunk step taken out each (timing only: their outputs are wrong, so their rel err is
# meaningless):
#   nodecode  the loaded words are the A operand as they are (no decode: loads, barrier, x copies, wgmma)
#   nosync    no CTA barrier in the step (each thread waits on its own x copies only; the buffers race)
#   nox       no x chunk copies after the first two (the tensor cores read stale chunks)
#   nowgmma   the decoded words XORed into one accumulator instead of the wgmma
#   bare      all four: the weight stream alone, in the same grid
# then, for each N in AHEADS (default "0 2"), src with `mma_grouped.L2_AHEAD = N` (the weight chunks a warp asks L2
# for past its register ring; the same bits).
# ~2-3 min. Carry .whl. TOKENS (default 512,1024), TILES (default the plans' (4,1,1) and (8,1,1)); TREES="" times
# no tree, AHEADS="" no lookahead.
set -u
source "$(dirname "$0")/common.sh"
F=hyserve/kernels/moe/mma_grouped_cuda.py
RAW='a[i][0] = lo[i >> 1].x; a[i][1] = lo[i >> 1].y; a[i][2] = lo[i >> 1].z ^ cd[i >> 2].x; a[i][3] = lo[i >> 1].w ^ cd[i >> 2].y;'
NODECODE=("s/^    for (int i = 0; i < 8; ++i) decode_step(lo, cd, base4, i, a\[i\]);\$/    for (int i = 0; i < 8; ++i) { $RAW }/")
NOSYNC=('/^    __syncthreads();  \/\/ \.\.\. for every thread.s copies; and every warp is done with chunk ch - 1.s buffer$/d')
NOX=('s/^    if (ch + 2 < nch) load_x_swizzled<BM, THREADS>(xs + (ch + 2) % 3 \* BUF, x, src, cnt, K, ch + 2, tid);$//')
FOLD='(void)n16; for (int i = 0; i < 8; ++i) c[0][0] += __uint_as_float(0x3c000000u | (0xffffu \& (a[i][0] ^ a[i][1] ^ a[i][2] ^ a[i][3])));'
NOWGMMA=("s/^    wgmma_chunk<NT, BM>(c, a, (unsigned int)__cvta_generic_to_shared(xb), n16);\$/    $FOLD/")
variant nodecode "${NODECODE[@]}"
variant nosync "${NOSYNC[@]}"
variant nox "${NOX[@]}"
variant nowgmma "${NOWGMMA[@]}"
variant bare "${NODECODE[@]}" "${NOSYNC[@]}" "${NOX[@]}" "${NOWGMMA[@]}"
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
B="import hyserve.kernels.moe.bench as b; b.MMA_GROUPED_TILES = (${TILES:-(4, 1, 1), (8, 1, 1)},); b.grouped_mma_times((${TOKENS:-512,1024},))"
rows() {  # rows TREE PYTHON: the bench's timing lines of PYTHON run on TREE
  PYTHONPATH=/tmp/site:$1 timeout 150 python3 -c "$2" 2>&1 | grep -E "^T=|Error|error" | sed 's/ rel err.*//'
}
for tree in ${TREES-src .v/nodecode/src .v/nosync/src .v/nox/src .v/nowgmma/src .v/bare/src src}; do
  echo "== $tree"
  rows "$tree" "$B"
done
for a in ${AHEADS-0 2}; do
  echo "== src, L2_AHEAD $a"
  rows src "import hyserve.kernels.moe.mma_grouped as m; m.L2_AHEAD = $a; $B"
done
rm -rf .v
