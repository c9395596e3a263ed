"""Compile the GDN kernels for sm_90 without a GPU: compile errors, registers, spills, shared memory, and
the PTX's barriers and load order (``_ptx_order``).

``PYTHONPATH=src python -m hyserve.kernels.gated_delta_rule.aot_check`` (any machine with the Triton wheel,
whose NVIDIA backend bundles ptxas). Arguments are specialised as the JIT does at launch (16-byte aligned
pointers, strides and D divisible by 16), at the model's shapes (bf16). Caveats: the local Triton version
may differ from the GPU's, and its ptxas may too (the register counts are indicative, not exact).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import warnings

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hyserve.kernels.causal_conv1d import triton_kernel as conv
from hyserve.kernels.gated_delta_rule import triton_decode as dec
from hyserve.kernels.gated_delta_rule import triton_prefill as pre
from hyserve.kernels.gdn_decode_step import triton_kernel as step

BF = "*bf16"
F32 = "*fp32"


def _resources(cubin: bytes) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    line = next((x.strip() for x in out.splitlines() if "REG:" in x), "?")
    return " ".join(p for p in line.split() if p.split(":")[0] in ("REG", "STACK", "SHARED"))


def _loop_sass(cubin: bytes) -> str:
    """``loop=N`` (the largest loop body's SASS instruction count) and its integer, fp32, global and shared load
    and barrier counts, from ``nvdisasm``: the per-iteration cost of a streaming kernel (``HYSERVE_AOT_SASS=1``)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        lines = subprocess.run([tool, "-c", f.name], capture_output=True, text=True).stdout.splitlines()
    labels = {m.group(1): i for i, x in enumerate(lines) if (m := re.match(r"\s*\.(L_x_\d+):", x))}
    best: list[str] = []
    for i, x in enumerate(lines):  # a branch back to an earlier label closes a loop
        m = re.search(r"BRA\s+`\(\.(L_x_\d+)\)", x)
        if m and labels.get(m.group(1), i) < i:
            ops = [
                o
                for y in lines[labels[m.group(1)] : i + 1]
                for o in re.findall(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", y)
            ]
            best = max(best, ops, key=len)
    kind = lambda pre: sum(o.startswith(pre) for o in best)  # noqa: E731
    ints = sum(kind(p) for p in ("IMAD", "IADD", "LOP", "SHF", "PRMT", "LEA", "ISETP", "SGXT", "VIADD"))
    fp = kind("FFMA") + kind("FMUL") + kind("FADD")
    return f"loop={len(best)} int={ints} fp={fp} ldg={kind('LDG')} lds={kind('LDS')} bar={kind('BAR')}"


FAILED: list[str] = []  # labels of the builds that did not compile (``main`` exits 1 if any)


def build(
    fn,
    types: dict,
    consts: dict,
    num_warps: int = 4,
    num_stages: int = 3,
    label: str = "",
    aligned: tuple[str, ...] = (),
    maxnreg: int | None = None,
    programs: int | None = None,
) -> None:
    """Compile ``fn`` for sm_90 and print its resources. Pointers, strides, D and the ``aligned`` integer
    arguments are marked divisible by 16, as the JIT marks them at the model's shapes: without that a masked
    load over K cannot be vectorised and the build's registers are not the GPU's (the pairs gate_up: 63
    against 56). ``maxnreg``: the plan's register cap, if any (STACK then shows what it spills). ``programs``:
    the grid's size at batch 1, for the CTAs that fit an H200 SM and the waves they make (``waves``)."""
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if n not in consts
        and (
            sig[n].startswith("*")
            or (sig[n] == "i32" and (n.startswith("stride") or n == "D" or n in aligned))
        )
    }
    name = label or fn.__name__
    try:
        k = triton.compile(
            ASTSource(fn, sig, constexprs=consts, attrs=attrs),
            target=GPUTarget("cuda", 90, 32),
            options={
                "num_warps": num_warps,
                "num_stages": num_stages,
                **({"maxnreg": maxnreg} if maxnreg else {}),
            },
        )
    except Exception as e:  # noqa: BLE001 - report and continue
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}")
        FAILED.append(name)
        return
    wgmma = k.asm["ttgir"].count("warp_group_dot")
    res = _resources(k.asm["cubin"])
    if os.environ.get("HYSERVE_AOT_SASS") == "1":
        res += "  " + _loop_sass(k.asm["cubin"])
    fit = ""
    if programs:
        regs = int(next((p.split(":")[1] for p in res.split() if p.startswith("REG:")), "0"))
        per_sm, w = waves(programs, num_warps, regs, k.metadata.shared)
        fit = f"  {programs} programs: {per_sm}/SM, {w:.2f} waves"
    print(
        f"ok   {name:44s} warps={num_warps} smem={k.metadata.shared:6d} wgmma={wgmma:2d}  {res}"
        f"  {_ptx_order(k.asm['ptx'])}{fit}  ptx={ptx_sha(k.asm['ptx'])}"
    )


def ptx_sha(ptx: str) -> str:
    """A fingerprint of the build's code: the PTX's sha1 without its debug information (line directives, file
    table, debug sections, the labels inlining leaves). Two trees whose builds print the same fingerprints run
    the same code on the GPU, so a refactor of a hot kernel that keeps them needs no device run."""
    code = re.sub(r"\.section\s+\.debug.*", "", ptx, flags=re.S)
    lines = (line for line in code.splitlines() if not re.match(r"\s*(\.loc|\.file|//|\$L__tmp\d+:)", line))
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:10]


SMS, SM_REGS, SM_WARPS, SM_CTAS, SM_SMEM = 132, 65536, 64, 32, 233472  # the H200 (sm_90)


def waves(programs: int, num_warps: int, regs: int, smem: int) -> tuple[int, float]:
    """(CTAs resident an SM, waves of the grid) on the H200: registers are allocated per warp in 256s (a thread's
    count rounded up to 8), each CTA also reserves 1 KB of shared memory. A grid just past a whole number of
    waves costs a kernel of short programs one more program's time: the batch-1 pairs gate_up at 64 registers
    (8 CTAs an SM, 1152 programs in 1.09 waves) took 14.5 us a layer against 11.6 at 56 (9, one wave)."""
    per_warp = -(-max(regs, 1) // 8) * 8 * 32
    per_sm = min(SM_CTAS, SM_WARPS // num_warps, SM_REGS // per_warp // num_warps, SM_SMEM // (smem + 1024))
    return per_sm, programs / max(1, per_sm * SMS)


def _ptx_order(ptx: str) -> str:
    """Latency hints from the PTX: CTA barriers, and the global loads issued before the PDL wait and before
    the first atomic (an acq_rel ticket orders the loads after it behind a round trip), of all of them; the
    TMA copies, if any, with those ahead of the PDL wait."""
    lines = ptx.splitlines()
    loads = [i for i, line in enumerate(lines) if "ld.global" in line]

    def before(marker: str) -> str:
        at = next((i for i, line in enumerate(lines) if marker in line), None)
        return "-" if at is None else str(sum(i < at for i in loads))

    bars = sum("bar.sync" in line for line in lines)
    out = f"bar={bars} ld={len(loads)} ld<wait={before('griddepcontrol.wait')} ld<atom={before('atom.')}"
    tma = [i for i, line in enumerate(lines) if "cp.async.bulk.tensor" in line]
    if tma:  # TMA copies (the GEMV's TMA option): how many in the code, how many ahead of the PDL wait
        wait = next((i for i, line in enumerate(lines) if "griddepcontrol.wait" in line), len(lines))
        out += f" tma={len(tma)} tma<wait={sum(i < wait for i in tma)}"
    return out


def main() -> None:
    warnings.filterwarnings("ignore")
    gdn = dict(HV=32, G=2, K=128, V=128, BK=128, DT=tl.bfloat16, PREC="tf32")
    cfg = pre._CONFIGS
    prep_types = {"q_ptr": BF, "k_ptr": BF, "v_ptr": BF, "g_ptr": F32, "beta_ptr": BF, "cu_ptr": "*i32", "w_ptr": BF,
                  "u_ptr": BF, "cum_ptr": F32, "rk_ptr": F32, "aqk_ptr": BF, "qs_ptr": F32, "scale": "fp32"}  # fmt: skip
    for fused in (1, 0):
        build(pre._prepare_kernel, prep_types, {**gdn, "BV": 128, "BN": 16, "FUSED": fused},
              cfg["prepare"]["num_warps"], label=f"prefill prepare FUSED={fused}")  # fmt: skip
    so_types = {"q_ptr": BF, "k_ptr": BF, "w_ptr": BF, "u_ptr": BF, "cum_ptr": F32, "rk_ptr": F32, "aqk_ptr": BF,
                "qs_ptr": F32, "cu_ptr": "*i32", "state_ptr": F32, "idx_ptr": "*i64", "init_ptr": "*i8", "o_ptr": BF}  # fmt: skip
    c = cfg["state_output"]
    build(pre._state_output_kernel, so_types, {**gdn, "BV": c["BV"]}, c["num_warps"], c["num_stages"],
          label=f"prefill state_output BV={c['BV']}")  # fmt: skip
    st_types = {"k_ptr": BF, "w_ptr": BF, "u_ptr": BF, "cum_ptr": F32, "rk_ptr": F32, "cu_ptr": "*i32", "state_ptr": F32,
                "idx_ptr": "*i64", "init_ptr": "*i8", "h_ptr": BF, "vnew_ptr": BF}  # fmt: skip
    c = cfg["state"]
    build(pre._state_kernel, st_types, {**gdn, "BV": c["BV"], "BN": 16}, c["num_warps"], c["num_stages"],
          label=f"prefill state (unfused) BV={c['BV']}")  # fmt: skip
    out_types = {"q_ptr": BF, "k_ptr": BF, "cum_ptr": F32, "rk_ptr": F32, "h_ptr": BF, "vnew_ptr": BF, "o_ptr": BF,
                 "cu_ptr": "*i32", "scale": "fp32"}  # fmt: skip
    c = cfg["output"]
    build(pre._output_kernel, out_types, {**gdn, "BV": c["BV"], "BN": 16}, c["num_warps"],
          label=f"prefill output (unfused) BV={c['BV']}")  # fmt: skip
    dec_types = {"q_ptr": BF, "k_ptr": BF, "v_ptr": BF, "g_ptr": F32, "beta_ptr": BF, "state_ptr": F32,
                 "idx_ptr": "*i64", "o_ptr": BF, "scale": "fp32"}  # fmt: skip
    for _, bv, w in dec._CONFIGS:
        build(
            dec._decode_kernel,
            dec_types,
            dict(HV=32, G=2, K=128, V=128, BK=128, BV=bv),
            w,
            label=f"decode BV={bv}",
        )
    step_types = {"x_ptr": BF, "z_ptr": BF, "a_ptr": BF, "b_ptr": BF, "convw_ptr": BF, "alog_ptr": BF, "dtb_ptr": BF,
                  "normw_ptr": BF, "conv_ptr": BF, "ssm_ptr": F32, "idx_ptr": "*i64", "o_ptr": BF, "cnt_qk_ptr": "*i32",
                  "cnt_o_ptr": "*i32", "eps": "fp32", "scale": "fp32"}  # fmt: skip
    for bound, bv, w in step._CONFIGS:
        consts = dict(H=16, HV=32, G=2, K=128, V=128, W=4, BK=128, BV=bv, BVF=128, NV=128 // bv, NW_DT=tl.bfloat16,
                      EARLY=step.early_loads(128 // bv, bound), USE_PDL=True)  # fmt: skip
        build(step._gdn_decode_step_kernel, step_types, consts, w, label=f"gdn_decode_step BV={bv}")
    conv_types = {
        "x_ptr": BF,
        "w_ptr": BF,
        "cs_ptr": BF,
        "cu_ptr": "*i32",
        "idx_ptr": "*i64",
        "init_ptr": "*i8",
        "out_ptr": BF,
        "a_ptr": BF,
        "b_ptr": BF,
        "a_log_ptr": BF,
        "dt_bias_ptr": BF,
        "g_ptr": F32,
        "beta_ptr": BF,
    }
    c = conv._CONFIG
    # the interior blocks' unmasked path off and on, then with the DeltaNet gates' column
    for fast, gates in ((False, False), (True, False), (True, True)):
        consts = dict(W=4, BT=c["BT"], BD=c["BD"], BN=16, EVEN_D=True, FAST=fast, GATES=gates, HV=32, HP=32)
        build(conv._conv_prefill_kernel, conv_types, consts, c["num_warps"],
              label=f"conv prefill BT={c['BT']} BD={c['BD']} fast={int(fast)} gates={int(gates)}")  # fmt: skip
    if FAILED:
        raise SystemExit(f"{len(FAILED)} kernel(s) did not compile: {', '.join(FAILED)}")


if __name__ == "__main__":
    main()
