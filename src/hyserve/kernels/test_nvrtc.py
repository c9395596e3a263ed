"""kernels/nvrtc.py: the driver structs have the C layout (CPU), and on the GPU a compiled kernel runs eagerly, with
PDL, and inside a CUDA graph, on the current stream."""

from __future__ import annotations

import ctypes

import pytest
import torch

from hyserve.kernels.nvrtc import _LaunchAttribute, _LaunchConfig, compile_kernels


def test_driver_structs_match_cuda_h():
    # CUlaunchConfig: 7 unsigned ints, the stream at 32, the attributes at 40, their count at 48; CUlaunchAttribute:
    # an enum, 4 bytes of padding, a 64-byte value union
    assert ctypes.sizeof(_LaunchConfig) == 56
    assert _LaunchConfig.hStream.offset == 32 and _LaunchConfig.attrs.offset == 40
    assert _LaunchConfig.numAttrs.offset == 48
    assert ctypes.sizeof(_LaunchAttribute) == 72 and _LaunchAttribute.value.offset == 8


SOURCE = r"""
template <int SCALE>
__global__ void axpy(float* y, const float* x, float a, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * SCALE * x[i];
}
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="NVRTC and the driver need the GPU")
@pytest.mark.parametrize("pdl", [False, True])
def test_compiled_kernel_runs_eagerly_and_in_a_graph(pdl):
    P, I, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    kernel = compile_kernels(SOURCE, {"axpy<2>": (P, P, F, I)}, torch.device("cuda"))["axpy<2>"]
    x = torch.randn(1000, device="cuda")
    y = torch.zeros(1000, device="cuda")
    kernel.launch(4, 256, (y, x, 0.5, 1000), pdl=pdl)
    torch.cuda.synchronize()
    assert torch.equal(y, x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.launch(4, 256, (y, x, 0.5, 1000), pdl=pdl)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(y, 3 * x)
    with pytest.raises(ValueError):
        kernel.launch(4, 256, (y, x, 0.5), pdl=pdl)


def test_template_kernel_names_the_instance_and_compiles_it_once(monkeypatch):
    from hyserve.kernels import nvrtc

    calls = []
    monkeypatch.setattr(
        nvrtc,
        "compile_kernels",
        lambda source, kernels, device: calls.append(kernels) or dict.fromkeys(kernels, 1),
    )
    nvrtc.template_kernel.cache_clear()
    params = (ctypes.c_void_p, ctypes.c_int)
    for _ in range(2):
        assert nvrtc.template_kernel("src", "gemv_mma", (8, True, False), params, torch.device("cpu")) == 1
    assert calls == [{"gemv_mma<8, true, false>": params}]
    nvrtc.template_kernel.cache_clear()
