"""One launch each of the grouped MoE gate_up and down over the experts' 12-bit copies (``moe/mma_grouped.py``) at T
tokens with the plan's routing, for ``ncu``. Environment: T (1024), TILES ("WARPS,RT,DEPTH;..."; the plan's tiles
if unset). Example, on the device:

    T=1024 TILES="8,1,2" ncu --clock-control none -k regex:grouped --section SpeedOfLight \\
        --section WarpStateStats --section Occupancy python3 scripts/device/ncu_grouped.py
"""

import os

import torch
import torch.nn.functional as F

from hyserve.kernels.moe.bench import make_layer, make_x
from hyserve.kernels.moe.configs import get_plan
from hyserve.kernels.moe.mma_experts import pack_mma_experts
from hyserve.kernels.moe.mma_grouped import down_grouped_mma, gate_up_grouped_mma
from hyserve.kernels.moe.routing import route_and_align

T = int(os.environ.get("T", "1024"))
lay = make_layer()
packed = pack_mma_experts(lay["w_gate_up"], lay["shared_gate_up"], lay["w_down"], lay["shared_down"])
x = make_x(T, 2048)
plan = get_plan(T, 256, 2048, 512, 8, x.dtype)
rt = route_and_align(F.linear(x, lay["gate_weight"]), 8, plan["block_m"], True, x.dtype)
routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks, plan["block_m"])
specs = os.environ.get("TILES")
for spec in specs.split(";") if specs else [None]:
    tiles = None if spec is None else tuple(int(v) for v in spec.split(","))
    h = gate_up_grouped_mma(x, packed, lay["shared_expert_gate"], *routed, tiles=tiles)
    down_grouped_mma(h, packed, *routed, tiles=tiles)
torch.cuda.synchronize()
