"""CUDA C++ kernels compiled at run time with NVRTC and launched through the driver API, with PDL.

For the few kernels that Triton cannot express well (a per-thread layout that must match a tensor-core
fragment, e.g. ``kernels/mma_gemv``). NVRTC ships with PyTorch's CUDA build, so this needs no compiler on the
serving machine and no new dependency; a source compiles in about a second, once per process (cached by
source and options). Launches take the current torch stream, so they are captured into CUDA graphs like any
other kernel, and ``pdl=True`` sets the programmatic-stream-serialization attribute the Triton kernels get
from ``kernels/pdl.py`` (the kernel must then call ``griddepcontrol.wait`` as that module's contract says).

Only ctypes is used: ``libnvrtc`` (compile to a cubin for the device's ``sm_XY``) and ``libcuda``
(``cuModuleLoadData``, ``cuModuleGetFunction``, ``cuLaunchKernelEx``).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import torch

_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_DEFAULT_DYNAMIC_SHARED = 48 * 1024  # what a launch may ask for before the function's attribute is raised


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: an enum id, padding to 8 bytes, then a 64-byte value union (its first int here)
    _fields_ = [
        ("id", ctypes.c_int),
        ("pad", ctypes.c_char * 4),
        ("value", ctypes.c_int),
        ("rest", ctypes.c_char * 60),
    ]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


@functools.cache
def _libnvrtc() -> ctypes.CDLL:
    """libnvrtc of torch's CUDA major version: by name (torch preloads it with its wheels), else from the
    nvidia-* wheels' folders or the CUDA toolkit."""
    major = (torch.version.cuda or "0").split(".")[0]
    names = [f"libnvrtc.so.{major}", "libnvrtc.so"]
    roots = [os.path.dirname(os.path.dirname(torch.__file__)), os.environ.get("CUDA_HOME", "/usr/local/cuda")]
    for root in roots:
        names += sorted(
            glob.glob(os.path.join(root, "nvidia", "**", f"libnvrtc.so.{major}*"), recursive=True)
        )
        names += sorted(glob.glob(os.path.join(root, "lib64", f"libnvrtc.so.{major}*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError(f"no NVRTC library found for CUDA {torch.version.cuda} (tried {names})")


def _check_cu(result: int, what: str) -> None:
    if result != 0:
        msg = ctypes.c_char_p()
        _libcuda().cuGetErrorString(result, ctypes.byref(msg))
        raise RuntimeError(f"{what} failed: {msg.value.decode() if msg.value else result}")


def _check_rtc(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what} failed: {lib.nvrtcGetErrorString(result).decode()}")


class Kernel:
    """One compiled ``__global__`` function; ``launch`` takes tensors (passed as their data pointers) and
    Python ints / floats matching the kernel's parameter types given at compile time."""

    def __init__(self, function: ctypes.c_void_p, param_types: tuple[type, ...], name: str) -> None:
        self.function, self.param_types, self.name = function, param_types, name
        self.max_shared = _DEFAULT_DYNAMIC_SHARED

    def launch(
        self, grid: int | tuple[int, int], block: int, args: tuple, shared_mem: int = 0, pdl: bool = False
    ) -> None:
        """Launch on the current stream: ``grid`` CTAs (or (x, y)) of ``block`` threads."""
        if len(args) != len(self.param_types):
            raise ValueError(f"{self.name} takes {len(self.param_types)} arguments, got {len(args)}")
        values = []
        for a, ty in zip(args, self.param_types):
            if isinstance(a, torch.Tensor):
                values.append(ctypes.c_void_p(a.data_ptr()))
            elif a is None:
                values.append(ctypes.c_void_p(0))
            else:
                values.append(ty(a))
        params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        gx, gy = (grid, 1) if isinstance(grid, int) else grid
        if shared_mem > self.max_shared:  # more than 48 KB of dynamic shared memory needs the opt-in, once
            _check_cu(
                _libcuda().cuFuncSetAttribute(
                    self.function, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem
                ),
                f"{self.name}: {shared_mem} bytes of dynamic shared memory",
            )
            self.max_shared = shared_mem
        attr = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        cfg = _LaunchConfig(
            gridDimX=gx, gridDimY=gy, gridDimZ=1, blockDimX=block, blockDimY=1, blockDimZ=1,
            sharedMemBytes=shared_mem, hStream=ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
            attrs=ctypes.pointer(attr) if pdl else None, numAttrs=1 if pdl else 0,
        )  # fmt: skip
        _check_cu(_libcuda().cuLaunchKernelEx(ctypes.byref(cfg), self.function, params, None), self.name)


@functools.cache
def _module(
    source: str, device: int, arch: str, names: tuple[str, ...], options: tuple[str, ...]
) -> dict[str, ctypes.c_void_p]:
    """The compiled functions, loaded into ``device``'s primary context (a module is per context)."""
    lib = _libnvrtc()
    prog = ctypes.c_void_p()
    _check_rtc(
        lib,
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"hyserve.cu", 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        for n in names:
            _check_rtc(lib, lib.nvrtcAddNameExpression(prog, n.encode()), "nvrtcAddNameExpression")
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", *(o.encode() for o in options)]
        res = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if res != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC could not compile the kernels {names}:\n{log.value.decode()}")
        size = ctypes.c_size_t()
        _check_rtc(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check_rtc(lib, lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        lowered = {}
        for n in names:
            out = ctypes.c_char_p()
            _check_rtc(
                lib, lib.nvrtcGetLoweredName(prog, n.encode(), ctypes.byref(out)), "nvrtcGetLoweredName"
            )
            lowered[n] = out.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    module = ctypes.c_void_p()
    _check_cu(_libcuda().cuModuleLoadData(ctypes.byref(module), cubin.raw), "cuModuleLoadData")
    functions = {}
    for n, low in lowered.items():
        f = ctypes.c_void_p()
        _check_cu(
            _libcuda().cuModuleGetFunction(ctypes.byref(f), module, low.encode()), "cuModuleGetFunction"
        )
        functions[n] = f
    return functions


def compile_kernels(
    source: str, kernels: dict[str, tuple[type, ...]], device: torch.device, options: tuple[str, ...] = ()
) -> dict[str, Kernel]:
    """Compile ``source`` for ``device`` (its ``sm_XY``; ``sm_90a`` on Hopper) and return the kernels named by
    ``kernels``' keys (name expressions, e.g. ``"gemv<8, true>"``), each with its parameters' ctypes types."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    arch = f"sm_{major}{minor}" + ("a" if major == 9 else "")
    with torch.cuda.device(index):
        torch.cuda.current_stream()  # the primary context current on this thread before the driver calls
        functions = _module(source, index, arch, tuple(kernels), tuple(options))
    return {n: Kernel(functions[n], types, n) for n, types in kernels.items()}


@functools.cache
def template_kernel(
    source: str, template: str, args: tuple, params: tuple[type, ...], device: torch.device
) -> Kernel:
    """The instance ``template<args...>`` (bools as true / false) of a ``__global__`` function template in
    ``source``, compiled for ``device`` once per process, with its parameters' ctypes types."""
    name = f"{template}<{', '.join(str(a).lower() if isinstance(a, bool) else str(a) for a in args)}>"
    return compile_kernels(source, {name: params}, device)[name]
