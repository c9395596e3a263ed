"""Compile the decode-step kernels for sm_90 without a GPU: compile errors, registers, spills, shared memory.

``PYTHONPATH=src python -m hyserve.kernels.aot_check`` covers the kernels the model runs at batch 1 outside
the DeltaNet (whose own check is ``hyserve.kernels.gated_delta_rule.aot_check``, same method and caveats):
the GEMV with and without its fused norm and residual, the fused MoE router with and without the norm, the
pairs gate_up and down kernels and their options, the grouped down kernels' residual epilogues and the paged
decode attention, at the model's shapes and tiles (bf16, PDL on). The CPU interpreter runs code the GPU
compiler may reject, so run this before spending device time on a change; it is not the JIT's launch path,
though (a ``None`` operand that failed at launch on the H200 compiled here), so it narrows the risk only.
Where the batch-1 grid is known it also prints the CTAs that fit an SM and the waves the grid makes: a grid just
past a whole wave (the pairs gate_up at 64 registers: 1152 programs, 8 an SM, 1.09 waves) cost the step more than
any instruction count here. A hint, not a rule: the routing out-projection is fastest at 1.62 waves (its plan's
BLOCK_K 2048 loads half of each row before the PDL wait; one wave at BLOCK_N 2 lost, docs/performance.md).
"""

from __future__ import annotations

import warnings

import torch

from hyserve.kernels.argmax import triton_kernel as argmax
from hyserve.kernels.attention import triton_decode as attn
from hyserve.kernels.attention import triton_decode_qk as attn_qk
from hyserve.kernels.attention import triton_store_kv as store_kv
from hyserve.kernels.gated_delta_rule.aot_check import BF, F32, FAILED, build
from hyserve.kernels.greedy_head import triton_kernel as greedy
from hyserve.kernels.linear import _plans
from hyserve.kernels.linear import triton_kernel as gemv
from hyserve.kernels.moe import (
    router,
    triton_decode,
    triton_gate_up,
    triton_pairs,
    triton_prefill,
)
from hyserve.kernels.moe.configs import get_plan
from hyserve.kernels.qk_norm_rope import triton_kernel as qk_rope
from hyserve.kernels.rmsnorm import triton_kernel as rmsnorm
from hyserve.kernels.routed_projection import triton_kernel as routed

I32 = "*i32"


def main() -> None:
    warnings.filterwarnings("ignore")
    gemv_types = {"x_ptr": BF, "w_ptr": BF, "y_ptr": BF, "g_ptr": BF, "r_ptr": BF, "eps": "fp32"}
    for shape, plan in _plans().items():
        if not isinstance(plan, dict):
            continue
        variants = [
            (0, 0, 0, 0),
            (1, 0, 0, 0),
            (0, 1, 0, 0),
            (1, 0, 1, 0),
            (0, 1, 1, 0),
            (1, 0, 0, 3),
            (0, 1, 0, 4),
        ]
        variants = [(*v, 0, 0) for v in variants] + [
            (1, 0, 0, 0, 1, 0),
            (0, 1, 0, 0, 1, 0),
            (1, 0, 0, 0, 1, 1),
        ]
        # HAS_NORM, HAS_RES, REDUCE_EACH, TMA stages, BCAST_X, HAS_RAW (the router's rows, routed_projection)
        for norm, res, red, tma, bx, raw in variants:
            bk = min(256, plan["BLOCK_K"]) if tma else plan["BLOCK_K"]
            types = dict(gemv_types, w_desc=f"tensordesc<bf16[{plan['BLOCK_N']}, {bk}]>" if tma else BF)
            consts = dict(BLOCK_M=1, BLOCK_N=plan["BLOCK_N"], BLOCK_K=bk, HAS_NORM=norm, HAS_RES=res,
                          REDUCE_EACH=red, TMA=tma, BCAST_X=bx, HAS_RAW=raw, USE_PDL=True)  # fmt: skip
            build(gemv._gemv_kernel, types, consts, plan.get("num_warps", 4), 1, aligned=("N", "K"),
                  programs=-(-int(shape.split("x")[0]) // plan["BLOCK_N"]),
                  label=f"gemv {shape} norm={norm} res={res} reduce_each={red} tma={tma} bcast_x={bx} raw={raw}")  # fmt: skip
    out_plan = _plans().get("2304x4096") or _plans()["2048x4096"]
    route_types = {"a_ptr": BF, "w_ptr": BF, "h_ptr": BF, "part_ptr": BF, "raw_ptr": F32, "counter_ptr": I32,
                   "ids_ptr": I32, "top_ptr": F32}  # fmt: skip
    for split in sorted({1, 2, 4, out_plan.get("M_SPLIT", 1)}):  # the plan's and the tuner's M_SPLIT values
        consts = dict(BLOCK_N=out_plan["BLOCK_N"], BLOCK_K=out_plan["BLOCK_K"], BCAST_X=bool(out_plan.get("BCAST_X")),
                      REDUCE_EACH=bool(out_plan.get("REDUCE_EACH")), M_SPLIT=split, EP=256, TOP_K=8, KP=8,
                      USE_PDL=True)  # fmt: skip
        build(routed._project_route_kernel, route_types, consts, out_plan.get("num_warps", 4), 1,
              label=f"routed out-projection m_split={split}", aligned=("H", "K", "E"),
              maxnreg=out_plan.get("maxnreg"), programs=(256 * split + 2048) // out_plan["BLOCK_N"])  # fmt: skip
    plan = get_plan(1, 256, 2048, 512, 8, torch.bfloat16)
    router_types = {"x_ptr": BF, "nw_ptr": BF, "xn_ptr": BF, "eps": "fp32", "gw_ptr": BF, "scratch_ptr": F32,
                    "counter_ptr": I32, "ids_ptr": I32, "w_ptr": F32, "sorted_ptr": I32, "meta_ptr": I32}  # fmt: skip
    be = plan.get("router_be", 8)
    for norm, route in ((False, True), (True, True), (True, False)):
        consts = dict(K=8, KP=8, TP=1, EP=256, BE=be, BK=8192 // be, BLOCK_M=16, ROUND=1, HAS_SHARED=False,
                      USE_DOT=False, DOT_PREC="tf32", GROUP=False, HAS_NORM=norm, ROUTE=route, USE_PDL=True)  # fmt: skip
        build(router._router_route_kernel, router_types, consts, 4, 1,
              label=f"router T=1 norm={int(norm)} route={int(route)}")  # fmt: skip
    gu = plan["gate_up"]
    gu_types = {
        "x_ptr": BF,
        "w_ptr": BF,
        "sw_ptr": BF,
        "sg_ptr": BF,
        "ids_ptr": I32,
        "topk_w_ptr": F32,
        "h_ptr": BF,
        "nw_ptr": BF,
        "eps": "fp32",
    }
    options = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1)]  # (REDUCE_EACH, PREFETCH, FROM_LOGITS)
    for red, pre, fl in options:
        for late in (0, 1) if (red, pre) == (0, 0) else (0,):  # LATE_WAIT: the split_shared routed launch
            for stages in (0, 4) if (red, pre, fl, late) == (0, 0, 0, 0) else (0,):  # TMA
                for pf in (0, 128) if (red, fl, late, stages) == (0, 0, 0, 0) else (0,):  # L2PF
                    bk = min(256, gu["BLOCK_K"])
                    desc = f"tensordesc<bf16[{gu['BLOCK_I']}, {bk}]>" if stages else BF
                    consts = dict(K_TOP=8, KP=8, EP=256, BLOCK_I=gu["BLOCK_I"], BLOCK_K=bk, HAS_SHARED_GATE=True,
                                  REDUCE_EACH=red, PREFETCH=pre, LATE_WAIT=late, FROM_LOGITS=fl, ROUND=1,
                                  TMA=stages, L2PF=pf, USE_PDL=True)  # fmt: skip
                    types = dict(gu_types, ids_ptr=F32 if fl else I32, w_desc=desc, sw_desc=desc)
                    plain = (red, fl, late, stages) == (0, 0, 0, 0) and pre
                    for nx, bx in ((0, 0), (0, 1), (1, 1)) if plain else ((0, 0),):  # NORM_X, BCAST_X
                        for sf in (0, 1) if plain and nx else (0,):  # SHARED_FIRST
                            build(triton_pairs._gate_up_pairs_kernel, types,
                                  dict(consts, NORM_X=nx, BCAST_X=bx, SHARED_FIRST=sf), gu.get("num_warps", 4), 1,
                                  aligned=("H", "I", "E", "sw_bytes"), maxnreg=gu.get("maxnreg"),
                                  programs=-(-512 // gu["BLOCK_I"]) * 9,
                                  label=f"pairs gate_up reduce_each={red} prefetch={pre} late_wait={late} "
                                  f"logits={fl} tma={stages} l2pf={pf} norm_x={nx} bcast_x={bx}"
                                  + (" shared_first=1" if sf else ""))  # fmt: skip
    dn = plan["down"]
    dn_types = {"h_ptr": BF, "wd_ptr": BF, "swd_ptr": BF, "ids_ptr": I32, "out_ptr": BF}
    for red, pre, fl in options:
        consts = dict(K_TOP=8, KP=8, EP=256, BLOCK_H=dn["BLOCK_H"], BLOCK_I=dn["BLOCK_I"], HAS_SHARED=True,
                      ADD_OUT=True, REDUCE_EACH=red, PREFETCH=pre, FROM_LOGITS=fl, ROUND=1, USE_PDL=True)  # fmt: skip
        types = dict(dn_types, ids_ptr=F32) if fl else dn_types
        build(triton_pairs._down_pairs_kernel, types, consts, dn.get("num_warps", 4), 1, programs=2048 // dn["BLOCK_H"],
              label=f"pairs down reduce_each={red} prefetch={pre} logits={fl}")  # fmt: skip
    sum_types = {"y_ptr": BF, "out_ptr": BF}
    build(triton_prefill._sum_kernel, sum_types, dict(K_TOP=8, HAS_SHARED=True, BLOCK_T=1, BLOCK_H=256,
          ADD_OUT=True, Y_EVICT="evict_first", USE_PDL=True), 2, 1, label="scatter sum add_out=1 evict")  # fmt: skip
    down_types = {"h_ptr": BF, "w_ptr": BF, "sw_ptr": BF, "sorted_ptr": I32, "meta_ptr": I32, "y_ptr": BF,
                  "cnt_ptr": I32, "out_ptr": BF}  # fmt: skip
    gu_types = {"x_ptr": BF, "w_ptr": BF, "sw_ptr": BF, "sg_ptr": BF, "topk_w_ptr": F32, "sorted_ptr": I32,
                "meta_ptr": I32, "h_ptr": BF}  # fmt: skip
    for t in (
        32,
        1024,
    ):  # the grouped gate_up and the scatter down (c=32 decode, prefill), pointer loads or TMA; the down
        # kernel with the sum kernel, or the sum in its tail
        pl = get_plan(t, 256, 2048, 512, 8, torch.bfloat16)
        gu, dn = pl["gate_up"], pl["down"]
        for use_tma in (False, True):
            stages = gu.get("num_stages", 3)
            desc = f"tensordesc<bf16[{gu['BLOCK_I']}, {gu['BLOCK_K']}]>" if use_tma else BF
            consts = dict(K_TOP=8, BLOCK_M=pl["block_m"], BLOCK_I=gu["BLOCK_I"], BLOCK_K=gu["BLOCK_K"], EVEN_K=True,
                          EVEN_I=True, HAS_SHARED_GATE=True, USE_DOT=True, DOT_PREC="tf32", TMA=use_tma,
                          STAGES=stages, W_EVICT="evict_first" if t > 32 else "",
                          H_EVICT="evict_last" if t > 32 else "", L2PF=0, USE_PDL=True)  # fmt: skip
            build(triton_gate_up._gate_up_kernel, dict(gu_types, w_desc=desc, sw_desc=desc), consts,
                  gu.get("num_warps", 4), stages, label=f"grouped gate_up T={t} tma={int(use_tma)}")  # fmt: skip
            if t > 32 and use_tma:  # the L2 prefetch of the first blocks' weights during the routing
                build(triton_gate_up._gate_up_kernel, dict(gu_types, w_desc=desc, sw_desc=desc),
                      dict(consts, L2PF=132), gu.get("num_warps", 4), stages,
                      label=f"grouped gate_up T={t} tma=1 l2pf=132")  # fmt: skip
        for fused, use_tma in ((False, False), (True, False), (False, True)):
            stages = dn.get("num_stages", 3)
            desc = f"tensordesc<bf16[{dn['BLOCK_H']}, {dn['BLOCK_K']}]>" if use_tma else BF
            consts = dict(BLOCK_M=pl["block_m"], BLOCK_H=dn["BLOCK_H"], BLOCK_K=dn["BLOCK_K"], EVEN=True,
                          DOT_PREC="tf32", FUSED_SUM=fused, K_TOP=8, HAS_SHARED=True, ADD_OUT=True, TMA=use_tma,
                          STAGES=stages, W_EVICT="evict_first" if t > 32 else "",
                          Y_EVICT="evict_last" if t > 32 else "", USE_PDL=True)  # fmt: skip
            build(triton_prefill._down_kernel, dict(down_types, w_desc=desc, sw_desc=desc), consts,
                  dn.get("num_warps", 4), stages,
                  label=f"scatter down T={t} fused_sum={int(fused)} tma={int(use_tma)}")  # fmt: skip
    red_types = {"h_ptr": BF, "w_ptr": BF, "sw_ptr": BF, "sorted_ptr": I32, "meta_ptr": I32, "out_ptr": BF}
    consts = dict(K_TOP=8, TP=16, BLOCK_M=16, BLOCK_H=64, BLOCK_K=128, NUM_K=4, EVEN=True, USE_DOT=True,
                  DOT_PREC="tf32", ADD_OUT=True, USE_PDL=True)  # fmt: skip
    build(triton_decode._down_reduce_kernel, red_types, consts, 4, 3, label="down_reduce add_out=1")
    att_types = {"q_ptr": BF, "k_ptr": BF, "v_ptr": BF, "bt_ptr": I32, "seq_lens_ptr": I32, "cu_q_ptr": I32,
                 "gate_ptr": BF, "out_ptr": BF, "part_o_ptr": F32, "part_lse_ptr": F32, "counter_ptr": I32,
                 "qk_scale": "fp32"}  # fmt: skip
    for single, fused in ((0, 0), (1, 0), (0, 1)):
        consts = dict(G=8, G_PAD=16, D=256, BLOCK_D=256, BLOCK_N=64, PAGE=16, SINGLE=single, FUSED_REDUCE=fused,
                      MERGE_CHUNK=attn.MERGE_CHUNK, HAS_GATE=True, DOT_PREC="tf32", USE_PDL=True)  # fmt: skip
        build(
            attn._paged_decode_split_kernel,
            att_types,
            consts,
            4,
            2,
            label=f"paged decode split single={single} fused={fused}",
        )
    att_qk_types = {"q_ptr": BF, "k_ptr": BF, "v_ptr": BF, "qw_ptr": BF, "kw_ptr": BF, "cos_ptr": F32, "sin_ptr": F32,
                    "pos_ptr": "*i64", "slot_ptr": "*i64", "k_cache_ptr": BF, "v_cache_ptr": BF, "bt_ptr": I32,
                    "seq_lens_ptr": I32, "cu_q_ptr": I32, "gate_ptr": BF, "out_ptr": BF, "part_o_ptr": F32,
                    "part_lse_ptr": F32, "counter_ptr": I32, "qk_scale": "fp32", "eps": "fp32"}  # fmt: skip
    # the split kernel with the q/k norm, RoPE and KV store inside
    for single, fused in ((0, 0), (1, 0), (0, 1)):
        consts = dict(G=8, G_PAD=16, D=256, BLOCK_D=256, BLOCK_N=32, PAGE=16, ROT=64, SINGLE=single,
                      FUSED_REDUCE=fused, MERGE_CHUNK=attn.MERGE_CHUNK, HAS_GATE=True, DOT_PREC="tf32",
                      USE_PDL=True)  # fmt: skip
        build(attn_qk._paged_decode_qk_split_kernel, att_qk_types, consts, 4, 2,
              label=f"paged decode qk split single={single} fused={fused}")  # fmt: skip
    red_att = {"part_o_ptr": F32, "part_lse_ptr": F32, "seq_lens_ptr": I32, "cu_q_ptr": I32, "gate_ptr": BF,
               "out_ptr": BF}  # fmt: skip
    build(attn._paged_decode_reduce_kernel, red_att, dict(D=256, BLOCK_D=256, BLOCK_N=64, S_PAD=16, HAS_GATE=True,
          USE_PDL=True), 4, 1, label="paged decode reduce")  # fmt: skip
    kv_types = {"k_ptr": BF, "v_ptr": BF, "k_cache_ptr": BF, "v_cache_ptr": BF, "slot_ptr": "*i64"}
    build(store_kv._store_kv_kernel, kv_types, dict(H=2, D=256, BLOCK_H=2, BLOCK_D=256, PAGE=16, USE_PDL=True), 4,
          1, label="store_kv")  # fmt: skip
    qk_types = {"q_ptr": BF, "k_ptr": BF, "qw_ptr": BF, "kw_ptr": BF, "cos_ptr": F32, "sin_ptr": F32,
                "pos_ptr": "*i64", "q_out_ptr": BF, "k_out_ptr": BF, "eps": "fp32"}  # fmt: skip
    build(qk_rope._qk_norm_rope_kernel, qk_types, dict(HQ=16, HK=2, D=256, BLOCK_HQ=16, BLOCK_HK=2, BLOCK_D=256,
          ROT=64, USE_PDL=True), 8, 1, label="qk_norm_rope")  # fmt: skip
    qks_types = {"q_ptr": BF, "k_ptr": BF, "v_ptr": BF, "qw_ptr": BF, "kw_ptr": BF, "cos_ptr": F32, "sin_ptr": F32,
                 "pos_ptr": "*i64", "slot_ptr": "*i64", "q_out_ptr": BF, "k_cache_ptr": BF, "v_cache_ptr": BF,
                 "eps": "fp32"}  # fmt: skip
    build(qk_rope._qk_norm_rope_store_kernel, qks_types, dict(HQ=16, HK=2, D=256, BLOCK_HQ=16, BLOCK_HK=2,
          BLOCK_D=256, ROT=64, PAGE=16, USE_PDL=True), 8, 1, label="qk_norm_rope_store")  # fmt: skip
    block_d, rows, warps = rmsnorm.launch_shape(2048)
    norm_types = {"x_ptr": BF, "r_ptr": BF, "w_ptr": BF, "out_ptr": BF, "h_ptr": BF, "eps": "fp32"}
    build(rmsnorm._rms_norm_kernel, norm_types, dict(D=2048, BLOCK_D=block_d, ROWS=rows, HAS_RES=False,
          USE_PDL=True), warps, 1, label="rms_norm 2048")  # fmt: skip
    am_types = {"x_ptr": BF, "out_ptr": F32, "partial_ptr": "*i64", "ids_ptr": "*i64", "counter_ptr": I32}
    build(argmax._logits_argmax_kernel, am_types, dict(BLOCK=argmax.BLOCK, S_PAD=128, USE_PDL=True), 4, 1,
          label="logits_argmax")  # fmt: skip
    build(greedy._limbs_kernel, {"x_ptr": BF, "p_ptr": I32, "stats_ptr": F32}, dict(BLOCK_K4=512, USE_PDL=True), 4, 1,
          label="greedy limbs")  # fmt: skip
    screen_types = {"q_ptr": I32, "scale_ptr": F32, "radius_ptr": F32, "wnorm_ptr": F32, "p_ptr": I32,
                    "stats_ptr": F32, "upper_ptr": F32, "lower_max_ptr": I32}  # fmt: skip
    for rows, (block_v, block_k, warps, stages) in greedy.SCREEN_PLAN.items():
        for tma_stages in sorted({0, stages or 4}):
            desc = f"tensordesc<i32[{block_v}, {block_k // 4}]>" if tma_stages else I32
            build(greedy._screen_kernel, dict(screen_types, q_desc=desc), dict(BLOCK_V=block_v, BLOCK_K4=block_k // 4,
                  N_PAD=rows, EVEN_K=True, USE_ASM=True, TMA=tma_stages, USE_PDL=True), warps, 1,
                  label=f"greedy screen N<={rows} tma={tma_stages}")  # fmt: skip
    block_r, maxc, block_k, warps = greedy.SELECT_PLAN
    select_types = {"w_ptr": BF, "x_ptr": BF, "upper_ptr": F32, "lower_max_ptr": I32, "best_ptr": "*i64",
                    "counter_ptr": I32, "ids_ptr": "*i64", "count_ptr": "*i64", "scratch_ptr": I32}  # fmt: skip
    build(greedy._select_kernel, select_types, dict(BLOCK_R=block_r, MAXC=maxc, BLOCK_K=block_k, EVEN_K=True,
          COUNT=False, USE_PDL=True), warps, 1, label="greedy select")  # fmt: skip
    if FAILED:
        raise SystemExit(f"{len(FAILED)} kernel(s) did not compile: {', '.join(FAILED)}")


if __name__ == "__main__":
    main()
