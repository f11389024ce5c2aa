"""The one-call C extension (csrc/nojit_fast.c, `nojit.loader._fastlaunch`), configured once per process
with torch's tensor type and dtypes and the driver's launch entry; Triton's and TileLang's fast paths both
launch through it."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("nojit")
_module: Any = None
_launch_ready = False


def fast_module() -> Any:
    """The C module, configured with torch's tensor type and dtypes (None where it is not built)."""
    global _module
    if _module is None:
        try:
            from nojit.loader import _fastlaunch
        except ImportError:  # pragma: no cover - a source tree without the built extension
            return None
        import torch

        dtypes: list[Any] = []
        for name in sorted(dir(torch)):
            value = getattr(torch, name)
            if isinstance(value, torch.dtype) and value not in dtypes:
                dtypes.append(value)
        _fastlaunch.tensor_type = torch.Tensor
        _fastlaunch.dtypes = tuple(dtypes[:64])
        _fastlaunch.configure(torch.Tensor, _fastlaunch.dtypes, 0)
        _fastlaunch.dlpack_status = _setup_dlpack(_fastlaunch, torch)
        _module = _fastlaunch
    return _module


def _setup_dlpack(m: Any, torch: Any) -> str:
    """Let C read tensors (and torch's current stream) through torch's DLPack C exchange API (DLPack 1.x).

    Returns "on M.m" or "off: why"; off (no capsule, another major version, NOJIT_DLPACK=0) leaves the
    reads through torch's Python API as before, said once in the log.
    """
    import warnings

    samples = []
    with warnings.catch_warnings():  # torch warns about its experimental dtypes (complex32, quantized)
        warnings.simplefilter("ignore")
        for dtype in m.dtypes:  # the producer's own DLDataType of each dtype, read from an empty tensor
            try:
                samples.append(torch.empty(0, dtype=dtype))
            except Exception:  # a dtype torch cannot allocate (quantized, bits): read through torch
                samples.append(None)
    # runners made with torch's raw stream accessor (nojit.loader.launch.torch_cuda.current_stream) read the stream
    # through the API instead; runners given any other accessor call it
    accessor = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    from nojit.loader.settings import settings

    enable = settings.dlpack
    status = m.dlpack_setup(torch.Tensor, tuple(samples), accessor, enable)
    if status.startswith("off"):
        log.info("nojit: tensors are read through torch's Python API, not the DLPack C exchange API (%s)", status)
    return status


def dlpack_status() -> str:
    """How the C launch path reads tensors: "on M.m" (DLPack C exchange API), "off: why", or "off: not built"."""
    m = fast_module()
    return getattr(m, "dlpack_status", "off: not built") if m is not None else "off: not built"


def ensure_launch_entry() -> None:
    """Hand C the driver's cuLaunchKernelEx (first load; opening libcuda is the cffi launcher's job)."""
    global _launch_ready
    if _launch_ready:
        return
    from nojit.loader.launch.cuda_launch import launcher

    lch = launcher()
    out = lch._ffi.new("uint64_t *")
    err = lch.new_error_buffer()
    rc = lch._c.nojit_launch_entry(out, err, len(err))
    if rc:
        raise lch.error(err, "CUDA driver", rc)
    m = fast_module()
    m.configure(m.tensor_type, m.dtypes, int(out[0]))
    _launch_ready = True
