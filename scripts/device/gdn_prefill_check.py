"""One-off (2026-12-03): the chunked DeltaNet prefill at the model's shapes on the GPU: relative error of the
output and the final state against the reference (one sequence of 1024 tokens), then the time of one layer at
1024 and 4096 tokens (``gated_delta_rule.bench``), with the chunk solve on 4 (the config) and 8 warps. Run before and after a change to the chunk solve."""

import torch

from hyserve.kernels.gated_delta_rule import bench
from hyserve.kernels.gated_delta_rule.reference import gated_delta_rule_prefill_reference
from hyserve.kernels.gated_delta_rule.triton_prefill import gated_delta_rule_prefill_triton

q, k, v, g, beta, state, cu, idx, init = bench.prefill_inputs([1024], seed=3)
s_fast, s_ref = state.clone(), state.clone()
o = gated_delta_rule_prefill_triton(q, k, v, g, beta, s_fast, cu, idx, init)
r = gated_delta_rule_prefill_reference(q, k, v, g, beta, s_ref, cu, idx, init)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


print(
    f"rel err vs reference at 1024: output {rel(o, r):.3e} state {rel(s_fast, s_ref):.3e} nan={bool(o.isnan().any())}"
)
for lens in ([1024], [4096]):
    for cfg in (None, {"prepare": {"num_warps": 8}}):
        print(
            f"prefill {lens[0]} {cfg or 'cfg'}: {bench.bench_prefill(lens, cfg, baselines=False)['us']:.1f} us"
        )
