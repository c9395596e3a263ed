#!/usr/bin/env bash
# What was prepared on the CPU on 2026-12-03 (second and third sessions) and not yet timed, on the H200, in two
# calls on one warm machine (carry .whl; PART=2 within ~30 s of PART=1's end, or the machine is gone with $W):
# PART=1 (~7 min): the GPU tests of the changes (DeltaNet step with its conv inputs before the PDL wait and
#   the paged decode with its first K/V tile before it - exact, on the default path; the RoPE tables and the
#   one-launch logits + argmax; the MoE "topk_in_experts" plan option; the GEMV and MoE gate_up "TMA" plan
#   options), the isolated GEMV sweep with TMA tiles (linear/bench.py --tma), then the B=1 decode profile
#   (B=4 too) with the committed plans and with the options switched on in the JSONs (edited on the device),
#   and with the DeltaNet output norm back in the step (the model edited; reported, not carried to PART=2);
#   the fastest JSON variant's files stay in $W/best_*.json and come back in $OUT.
# PART=2 (~5 min): the HTTP table and the full-size verify with those JSONs.
set -u
source "$(dirname "$0")/common.sh"
MOE=src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json
GEMV=src/hyserve/kernels/linear/configs/gemv.json
if [ "${PART:-1}" = 2 ]; then
  cp $W/best_gemv.json $GEMV; cp $W/best_moe.json $MOE
  echo "plans of $(cat $W/best.txt)"
  OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
    | grep -E "^(decode|ttft|throughput) |ready after"
  TAILN=9 run verify $((590 - SECONDS)) python3 -m hyserve verify --model $M --load-format dummy \
    --kv-cache-memory-gb 4 --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
  tar czf "$OUT/results2.tgz" -C $W .
  exit 0
fi
run pytest 150 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/gdn_decode_step \
  src/hyserve/kernels/attention src/hyserve/kernels/test_pdl.py src/hyserve/kernels/linear \
  src/hyserve/kernels/moe/test_moe.py src/hyserve/kernels/argmax src/hyserve/kernels/qk_norm_rope -k "gdn or pdl or decode_kernel or padding or gemv or pairs_kernel_options \
  or topk_in_experts or (cuda_graph and (plan or topk)) or argmax or rope"
grep -E "^FAILED|^E " $W/pytest.log | head -n 12
cp $MOE $W/moe.json; cp $GEMV $W/gemv.json
TAILN=24 run sweep 120 python3 -m hyserve.kernels.linear.bench --block-k 1024 --tma 2,3,4,6 --write
# the sweep times each shape alone; where it picked cuBLAS over the committed GEMV plan (the qkv, whose GEMV
# carries the fused pre-norm), the committed plan stays
python3 - <<'PY'
import json
old, new = json.load(open("/tmp/w/gemv.json")), json.load(open("src/hyserve/kernels/linear/configs/gemv.json"))
for shape, plan in new["plans"].items():
    if plan == "cublas" and isinstance(old["plans"].get(shape), dict):
        new["plans"][shape] = old["plans"][shape]
json.dump(new, open("/tmp/w/gemv_sweep.json", "w"), indent=1)
PY
cp $W/gemv.json $GEMV
# variant NAME GEMV_JSON MOE_EDIT: the B=1 (and B=4) profile with that gemv.json and the MoE plans of the T=1,
# 2, 4 buckets updated with MOE_EDIT (a JSON object; "gate_up.TMA" sets a key of the gate_up config)
variant() {
  cp "$2" $GEMV
  python3 - "$3" <<'PY'
import json, sys
d = json.load(open("/tmp/w/moe.json"))
for key, value in json.loads(sys.argv[1]).items():
    for t in ("1", "2", "4"):
        plan = d["buckets"][t]
        if "." in key:
            part, name = key.split(".")
            plan[part][name] = value
            if name == "TMA":
                plan[part]["BLOCK_K"] = min(plan[part]["BLOCK_K"], 256)
        else:
            plan[key] = value
json.dump(d, open("src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json", "w"), indent=1)
PY
  TAILN=0 run "profile_$1" 100 python3 scripts/profile_decode.py --model $M --load-format dummy \
    --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,4 \
    --prefill-graph-sizes none --batch 1,4 --steps 30 --no-warmup
  local ms b4; ms=$(grep -h "== batch 1:" "$W/profile_$1.log" | sed -E 's/.*step ([0-9.]+) ms.*/\1/')
  b4=$(grep -h "== batch 4:" "$W/profile_$1.log" | sed -E 's/.*step ([0-9.]+) ms.*/\1/')
  echo "$1 ${ms:-fail} B=4 ${b4:-fail}" | tee -a $W/variants.txt $OUT/variants.txt
  cp "$W/profile_$1.log" "$OUT/"
  [ -n "$ms" ] && cp $GEMV "$W/gemv_$1.json" && cp $MOE "$W/moe_$1.json"
}
variant base $W/gemv.json '{}'
variant topk $W/gemv.json '{"topk_in_experts": true}'
variant moe_tma $W/gemv.json '{"gate_up.TMA": 4}'
variant tma_sweep $W/gemv_sweep.json '{}'
variant all_tma_topk $W/gemv_sweep.json '{"topk_in_experts": true, "gate_up.TMA": 4}'
MODEL=src/hyserve/model/qwen3_5.py
cp $MODEL $W/model.py
# the DeltaNet output norm back in the step (its head-wide ticket) instead of out_proj's GEMV prologue
sed -i 's/norm_in_out_proj = ops.gdn_step_splits_heads/norm_in_out_proj = False and ops.gdn_step_splits_heads/' \
  $MODEL && variant gdn_norm_in_step $W/gemv.json '{}'
cp $W/model.py $MODEL
variant base_again $W/gemv.json '{}'
sort -k2 -n $W/variants.txt | grep -v fail | grep -v "^gdn_" | head -n 1 | tee $W/best.txt  # JSON variants only
best=$(cut -d' ' -f1 $W/best.txt)
cp "$W/gemv_$best.json" $W/best_gemv.json; cp "$W/moe_$best.json" $W/best_moe.json
cp $W/best_gemv.json "$OUT/gemv.json"; cp $W/best_moe.json "$OUT/moe.json"
cp $W/gemv.json $GEMV; cp $W/moe.json $MOE
sed -n '/== batch 1:/,/^$/p' "$W/profile_$best.log" | head -n 12
tar czf "$OUT/results1.tgz" -C $W .
