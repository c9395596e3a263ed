"""Run the decode-path ops once each at T=1 and T=32 (real shapes, bf16) for ``ncu`` to profile.

usage: ncu --clock-control none -k regex:NAME --section ... python3 scripts/ncu_ops.py
The warm-up launch compiles; the second launch of each op is the one to read (ncu ``--launch-skip``
is not needed: compare the pairs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyserve.kernels.gdn_decode_step.bench import step_inputs
from hyserve.kernels.gdn_decode_step.triton_kernel import gdn_decode_step_triton
from hyserve.kernels.moe.bench import make_layer, make_x
from hyserve.kernels.moe.triton_moe import fused_moe_triton
from hyserve.kernels.rmsnorm import rms_norm


def main() -> None:
    layer = make_layer()
    w_in = torch.randn(12352, 2048, device="cuda").to(torch.bfloat16)
    w_out = torch.randn(2048, 4096, device="cuda").to(torch.bfloat16)
    for T in (1, 32):
        x = make_x(T)
        for _ in range(2):
            fused_moe_triton(
                x,
                layer["gate_weight"],
                layer["w_gate_up"],
                layer["w_down"],
                8,
                layer["shared_gate_up"],
                layer["shared_down"],
                layer["shared_expert_gate"],
            )
            gdn_decode_step_triton(*step_inputs(T, 1)[0])
            F.linear(x, w_in)
            F.linear(torch.randn(T, 4096, device="cuda").to(torch.bfloat16), w_out)
            rms_norm(x, layer["shared_expert_gate"][0], 1e-6, x.clone())
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
