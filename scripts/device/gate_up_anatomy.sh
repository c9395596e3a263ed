#!/usr/bin/env bash
# Where the one-token gate_up over the experts' 12-bit copies (`moe/mma_pairs.py`, `gate_up_pairs_mma`) spends its
# time: `moe.bench --mma-pairs` (gate_up + mma down, 8 layers in one graph, us a layer) on src and on copies of it with
# one dependency taken out each (timing only: their outputs are wrong):
#   noids  every CTA's weights requested before the PDL wait (expert = its pair index: no wait on the routing's ids)
#   nonorm x copied without the RMS norm (no block reduction before the first mma)
#   nomma  the chunks' words XORed into the accumulator instead of decoded and multiplied (loads only)
#   bare   all three: the launch's pure weight stream
#   esclast  (the same bits) each row's first escape loaded after the ring, as before 734a43d (src: after the norm)
# then (unless NCU=0) ncu's warp-stall samples per SASS instruction of the kernel on src (the top lines). Carry .whl.
# ~4 min (NCU=0: ~2). TREES: the trees timed (default: src, the five copies, src again).
set -u
source "$(dirname "$0")/common.sh"
F=hyserve/kernels/moe/mma_pairs.py
NOIDS=('s/^  if (shared) start(E);$/  start(shared ? E : p);/' '/^  if (!shared) start(__ldcg(ids + p));$/d')
NONORM=('s/load_x<SPLIT, NWR>(xn_s, x, nw, true,/load_x<SPLIT, NWR>(xn_s, x, nw, false,/')
X='c[0] += __uint_as_float(0x3c000000u | (0xffffu \& (lo[0].x ^ lo[0].y ^ lo[0].z ^ lo[0].w ^ lo[1].x ^ lo[1].y ^ lo[1].z ^ lo[1].w ^ lo[2].x ^ lo[2].y ^ lo[2].z ^ lo[2].w ^ lo[3].x ^ lo[3].y ^ lo[3].z ^ lo[3].w ^ cd[0].x ^ cd[0].y ^ cd[0].z ^ cd[0].w ^ cd[1].x ^ cd[1].y ^ cd[1].z ^ cd[1].w ^ x2[t] ^ base4)));'
NOMMA=("s/^    chunk_mma(c, lo, cd, base4, x2, (s0 + ch \* 8) \* 8, t);\$/    $X/")
variant noids "${NOIDS[@]}"
variant nonorm "${NONORM[@]}"
variant nomma "${NOMMA[@]}"
variant bare "${NOIDS[@]}" "${NONORM[@]}" "${NOMMA[@]}"
variant esclast '/^  esc.first(ecol, edelta);  \/\/ threads < 16/d' \
  's/^\(    for (int w = 0; w < SPLIT; ++w) acc += part\[w\]\[tid\];\)$/\1\n    esc.first(ecol, edelta);/'
B='import hyserve.kernels.moe.bench as b; b.MMA_PAIRS_TILES = ((2, 2), (2, 1), (4, 2)); b.mma_pairs_times()'
for tree in ${TREES:-src .v/esclast/src .v/noids/src .v/nonorm/src .v/nomma/src .v/bare/src src}; do
  echo "== $tree"
  PYTHONPATH=/tmp/site:$tree timeout 120 python3 -c "$B" 2>&1 | grep -E "^gate_up (mma|triton)" | grep -v "triton *down"
done
[ "${NCU:-1}" = 0 ] && { rm -rf .v; exit 0; }
echo "== ncu (src)"
timeout 150 ncu --clock-control none -k regex:gate_up_pairs_mma -c 1 --section WarpStateStats --section SourceCounters \
  -f -o $W/gu python3 scripts/device/ncu_pairs.py > $W/ncu_run.log 2>&1; echo "ncu rc=$?"; tail -n 3 $W/ncu_run.log
ncu -i $W/gu.ncu-rep --page source --csv --print-source sass > $OUT/gu_sass.csv 2> $W/ncu_src.err
echo "source page rc=$? $(wc -l < $OUT/gu_sass.csv) lines"; head -c 600 $W/ncu_src.err
python3 - $OUT/gu_sass.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
if head is None:
    sys.exit("no stall-sampling column; first rows: %r" % rows[:3])
cols = rows[head]
src = next(i for i, c in enumerate(cols) if c.strip() == "Source")
smp = next(i for i, c in enumerate(cols) if "Sampling (All" in c)
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0
body = [r for r in rows[head + 1 :] if len(r) > smp]
total = sum(num(r[smp]) for r in body) or 1
print(f"{len(body)} SASS lines, {total:.0f} stall samples; the top 30 (share, line index, instruction):")
for k, r in sorted(enumerate(body), key=lambda kr: -num(kr[1][smp]))[:30]:
    print(f"{100 * num(r[smp]) / total:5.1f}% {k:5d} {r[src].strip()[:90]}")
PY
rm -rf .v
