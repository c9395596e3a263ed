"""One-off: the pairs gate_up at batch 1 alone, plain (x normed) against NORM_X (x raw, the routed projection's
raw top-k logits), 40 launches in a CUDA graph with fresh expert ids each, real shapes."""

import json
import os
import sys

import torch

from hyserve.kernels.moe import triton_pairs as tp

torch.manual_seed(0)
dev = "cuda"
E, H, I, K = 256, 2048, 512, 8
L = 40
w = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02
sw = torch.randn(2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02
sg = torch.randn(1, H, device=dev, dtype=torch.bfloat16) * 0.02
nw = torch.randn(H, device=dev, dtype=torch.bfloat16) * 0.1
x = torch.randn(L, 1, H, device=dev, dtype=torch.bfloat16)
ids = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(L)]).int().view(L, 1, K)
raw = torch.randn(L, 1, K, device=dev)
wts = torch.softmax(raw, -1)
base = json.load(open("src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json"))["buckets"]["1"]["gate_up"]
variants = {
    "plain": (base, False, 1),
    "norm_x": (base, True, 1),
    "norm_x r56": ({**base, "maxnreg": 56}, True, 1),
    "nx -nw": (base, True, 3),
    "nx -nw ss wide": (base, True, 35),
    "nx -nw ss wide r56": ({**base, "maxnreg": 56}, True, 35),
    "norm_x ss wide r56": ({**base, "maxnreg": 56}, True, 33),
    "norm_x no l2pf": ({**base, "L2PF": 0}, True, 1),
    "norm_x no l2pf r56": ({**base, "L2PF": 0, "maxnreg": 56}, True, 1),
}
rows = []
for name, (cfg, nx, flags) in variants.items():
    os.environ["HYS_NX"] = str(flags)
    def step():
        for i in range(L):
            if nx:
                tp.gate_up_pairs(x[i], w, sw, sg, ids[i], raw[i], cfg, norm_weight=nw, norm_eps=1e-6)
            else:
                tp.gate_up_pairs(x[i], w, sw, sg, ids[i], wts[i], cfg)
    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(5):
        t0.record()
        for _ in range(50):
            g.replay()
        t1.record()
        torch.cuda.synchronize()
        ts.append(t0.elapsed_time(t1) / 50 / L * 1e3)
    rows.append((name, sorted(ts)[2]))
gb = 9 * 2 * I * H * 2 / 1e9
for name, us in rows:
    print(f"{name:24s} {us:7.2f} us a layer  {gb / us * 1e6 / 1e3:6.2f} TB/s", file=sys.stdout)
for cache in tp._gate_up_pairs_kernel.device_caches.values():
    for key, kern in cache[0].items():
        print("regs", kern.n_regs, "spills", kern.n_spills, str(key)[-160:])
