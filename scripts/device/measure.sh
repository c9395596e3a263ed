#!/usr/bin/env bash
# One H200 call: decode-step profile (B=1, 32), MoE tile tuning (written into kernels/moe/configs/), then
# the HTTP benchmark table (serve_bench.sh). Everything lands in $OUT/results.tgz (the device returns at
# most 8 files); the Triton kernels the server compiled go to $OUT/triton_cache.tgz: unpack it into
# .triton-cache/ and carry that folder next time to skip recompiling unchanged kernels. Carry .whl too.
set -u
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
W=/tmp/w; mkdir -p $W
M=configs/Qwen3.6-35B-A3B
CFG=src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json
TC=~/.triton/cache
[ -d .triton-cache ] && mkdir -p $TC && cp -r .triton-cache/. $TC/
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local s=$SECONDS
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; echo "rc=$? in $((SECONDS - s)) s"; }
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
run profile 170 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --batch 1,32 --steps 20 --trace-dir $W
tail -n 4 $W/profile.log
if [ "${SKIP_TUNE:-0}" != 1 ]; then
  run tune_decode 170 python3 -m hyserve.kernels.moe.tune --tokens 1,2,4,8,16,32,64,128 --out $CFG
  run tune_prefill 120 python3 -m hyserve.kernels.moe.tune --tokens 256,512,1024,2048,4096,8192 --out $CFG --merge
  cp $CFG $W/moe_configs.json
  grep -h "best" $W/tune_*.log | cut -c1-160
fi
touch $W/marker
OUT=$W bash scripts/device/serve_bench.sh
(cd $TC && find . -mindepth 1 -maxdepth 1 -type d -newer $W/marker -print0 | xargs -0 tar czf "$OUT/triton_cache.tgz")
echo "== profile"; sed -n '/== batch 1:/,/^$/p' $W/profile.log | head -n 24; tail -n 4 $W/profile.log
tar czf "$OUT/results.tgz" -C $W --exclude marker .
ls -la "$OUT"
