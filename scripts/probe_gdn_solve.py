"""Probe: what the chunk solve's inverse costs in the DeltaNet prefill's ``_prepare_kernel``, and a variant.

``python scripts/probe_gdn_solve.py [--lens 1024,4096]`` (GPU; ``TRITON_INTERPRET=1`` on the CPU checks the
variants' values on a tiny shape).

Writes a copy of ``kernels/gated_delta_rule/triton_prefill.py`` with a constexpr ``INV`` in the solve kernel and
imports it: 0 skips the inverse (T = I + A: wrong values, the kernel's time without it), 1 is the production
forward substitution on the 16x16 diagonal blocks, 2 inverts those blocks by the product
(I + N)^-1 = (I - N)(I + N^2)(I + N^4)(I + N^8) as batched [4, 16, 16] dots. Prints each variant's output error
against the fp32 reference and the whole wrapper's graph-replayed time per solve-kernel warp count.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

import hyserve.kernels.gated_delta_rule.triton_prefill as tp
from hyserve.kernels.gated_delta_rule.reference import gated_delta_rule_prefill_reference

GPU = torch.cuda.is_available()

SERIES = '''

@triton.jit
def _chunk_inverse_series(a, PREC: tl.constexpr):
    """_chunk_inverse with the diagonal blocks' inverse as (I - N)(I + N^2)(I + N^4)(I + N^8), batched dots."""
    r64 = tl.arange(0, 64)
    b4 = tl.arange(0, 4)
    r16 = tl.arange(0, 16)
    same = b4[:, None, None, None] == b4[None, None, :, None]
    n1 = tl.sum(tl.where(same, tl.reshape(a, (4, 16, 4, 16)), 0.0), 2)  # [4, 16, 16] strictly lower
    eye16 = tl.where(r16[None, :, None] == r16[None, None, :], 1.0, 0.0) + tl.zeros((4, 16, 16), tl.float32)
    n2 = tl.dot(n1, n1, input_precision=PREC)
    n4 = tl.dot(n2, n2, input_precision=PREC)
    n8 = tl.dot(n4, n4, input_precision=PREC)
    x = tl.dot(eye16 - n1, eye16 + n2, input_precision=PREC)
    x = tl.dot(x, eye16 + n4, input_precision=PREC)
    x = tl.dot(x, eye16 + n8, input_precision=PREC)
    d_inv = tl.reshape(tl.where(same, x[:, :, None, :], 0.0), (64, 64))
    lower = tl.where((r64[:, None] // 16) > (r64[None, :] // 16), a, 0.0)
    eye = tl.where(r64[:, None] == r64[None, :], 1.0, 0.0)
    n = tl.dot(d_inv, lower, input_precision=PREC)
    n2b = tl.dot(n, n, input_precision=PREC)
    p = tl.dot(eye - n, eye + n2b, input_precision=PREC)
    return tl.dot(p, d_inv, input_precision=PREC)

'''


def variant_module():
    src = Path(tp.__file__).read_text()
    src = src.replace(
        '\n\n@triton.jit(do_not_specialize=["N"])\ndef _prepare_kernel(',
        SERIES + '\n@triton.jit(do_not_specialize=["N"])\ndef _prepare_kernel(',
        1,
    )
    src = src.replace(
        "PREC: tl.constexpr, FUSED: tl.constexpr,\n):",
        "PREC: tl.constexpr, FUSED: tl.constexpr, INV: tl.constexpr,\n):",
        1,
    )
    src = src.replace(
        "    t = _chunk_inverse(a, PREC)\n",
        "    if INV == 0:\n        t = a + tl.where(eye, 1.0, 0.0)\n    elif INV == 1:\n        t = _chunk_inverse(a, PREC)\n"
        "    else:\n        t = _chunk_inverse_series(a, PREC)\n",
        1,
    )
    src = src.replace("BV=bvf, BN=bn, FUSED=fused,", 'BV=bvf, BN=bn, FUSED=fused, INV=cfg.get("inv", 1),', 1)
    assert src.count("INV") == 4, "the production file changed: update the probe's edits"
    path = Path("/tmp/gdn_prefill_variant.py")
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("gdn_prefill_variant", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gdn_prefill_variant"] = mod
    spec.loader.exec_module(mod)
    return mod


def inputs(t: int, h: int, hv: int, kd: int, dtype, device):
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(t, 2 * h * kd + hv * kd, device=device, dtype=dtype, generator=gen)
    q = x[:, : h * kd].view(t, h, kd)
    k = x[:, h * kd : 2 * h * kd].view(t, h, kd)
    v = x[:, 2 * h * kd :].view(t, hv, kd)
    g = -torch.rand(t, hv, device=device, generator=gen) * 0.5
    beta = torch.rand(t, hv, device=device, generator=gen).to(dtype)
    state = torch.randn(1, hv, kd, kd, device=device, generator=gen) * 0.1
    cu = torch.tensor([0, t], device=device, dtype=torch.int32)
    idx = torch.zeros(1, dtype=torch.long, device=device)
    init = torch.ones(1, dtype=torch.bool, device=device)
    return q, k, v, g, beta, state, cu, idx, init


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lens", default="1024,4096" if GPU else "128")
    args = parser.parse_args()
    mod = variant_module()
    dev = "cuda" if GPU else "cpu"
    dtype = torch.bfloat16 if GPU else torch.float32
    h, hv, kd = (16, 32, 128) if GPU else (2, 4, 32)
    for t in (int(x) for x in args.lens.split(",")):
        q, k, v, g, beta, state0, cu, idx, init = inputs(t, h, hv, kd, dtype, dev)
        s_ref = state0.clone()
        o_ref = gated_delta_rule_prefill_reference(
            q.float(), k.float(), v.float(), g, beta.float(), s_ref, cu, idx, init
        )
        cells = []
        for inv in (1, 2, 0):
            s = state0.clone()
            o = mod.gated_delta_rule_prefill_triton(q, k, v, g, beta, s, cu, idx, init, configs={"inv": inv})
            cells.append(f"inv={inv}: o {rel(o, o_ref):.2e} state {rel(s, s_ref):.2e}")
        print(f"T={t} error against the fp32 reference: " + "; ".join(cells), flush=True)
        if not GPU:
            continue
        import triton.testing as tt

        for warps in (4, 8):
            cells = []
            for inv in (1, 2, 0):
                cfg = {"inv": inv, "prepare": {"num_warps": warps}}
                s = state0.clone()
                call = (q, k, v, g, beta, s, cu, idx, init)
                fn = lambda cfg=cfg, call=call: mod.gated_delta_rule_prefill_triton(*call, configs=cfg)  # noqa: E731
                cells.append(
                    f"inv={inv} {1e3 * tt.do_bench_cudagraph(fn, rep=50, return_mode='median'):6.1f}"
                )
            print(f"T={t} solve warps={warps}: wrapper us " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
