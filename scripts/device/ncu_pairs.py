"""One launch each of the one-token MoE kernels, the Triton pairs kernels of the batch-1 plan and ``moe/mma_pairs.py``'s
over the experts' 12-bit copies (GATE_UP_TILES, KSPLIT), with a given routing as in the decode step, for ``ncu``.
Example, on the device:

    ncu --clock-control none -k regex:pairs --section SpeedOfLight --section WarpStateStats \\
        --section Occupancy python3 scripts/device/ncu_pairs.py
"""

import torch

from hyserve.kernels.moe.bench import make_layer
from hyserve.kernels.moe.configs import get_plan
from hyserve.kernels.moe.mma_experts import pack_mma_experts
from hyserve.kernels.moe.mma_pairs import down_pairs_mma, gate_up_pairs_mma
from hyserve.kernels.moe.triton_pairs import down_pairs, gate_up_pairs

lay = make_layer()
packed = pack_mma_experts(lay["w_gate_up"], lay["shared_gate_up"], lay["w_down"], lay["shared_down"])
plan = get_plan(1, 256, 2048, 512, 8, torch.bfloat16)
g = torch.Generator(device="cuda").manual_seed(3)
x = torch.randn(1, 2048, generator=g, device="cuda").bfloat16()
nw = (torch.randn(2048, generator=g, device="cuda") * 0.1).bfloat16()
raw, ids = (x.float() @ lay["gate_weight"].float().T).topk(8, -1)
ids, raw = ids.int().contiguous(), raw.contiguous()
sg = lay["shared_expert_gate"]
h = gate_up_pairs(
    x, lay["w_gate_up"], lay["shared_gate_up"], sg, ids, raw, plan["gate_up"], norm_weight=nw, norm_eps=1e-6
)
down_pairs(h, lay["w_down"], lay["shared_down"], ids, plan["down"])
h = gate_up_pairs_mma(x, packed, ids, raw, nw, 1e-6, sg)
down_pairs_mma(h, packed, ids)
torch.cuda.synchronize()
