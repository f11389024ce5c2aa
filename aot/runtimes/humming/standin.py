"""A stand-in H200 for Humming in the build process (no GPU): its device info and torch's device calls.

Humming reads the device through its native `_DeviceInfo` (humming/device.py) and enters
`torch.cuda.device(i)` around its selection code; both need a GPU. In the build worker only, the
deployment's facts (compute capability, SM count, name) and sm_90's fixed limits stand in for them,
so Humming's own heuristics (humming/tune/sm90*.py) choose exactly what they choose on an H200.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

# sm_90 hardware limits (CUDA programming guide, compute capability 9.0) and H200 SXM facts.
_SM90 = dict(max_threads_per_block=1024, max_threads_per_sm=2048, max_registers_per_sm=65536,
             default_smem_size=48 * 1024, max_smem_size=227 * 1024, l1_cache_size=256 * 1024,
             l2_cache_size=50 * 1024 * 1024, sm_clock_khz=1980000, memory_clock_khz=3201000,
             memory_bus_width=6144)


def device_value(name: str, capability: tuple[int, int], sm_count: int) -> Any:
    major, minor = capability
    v = types.SimpleNamespace(index=0, name=name, is_ppu=False, sm_count=sm_count, sm_major=major, sm_minor=minor,
                              sm_version=major * 10 + minor, **_SM90)
    v.l2_cache_size_mb = v.l2_cache_size / 2**20
    v.l1_cache_size_kb = v.l1_cache_size / 1024
    v.max_smem_size_kb = v.max_smem_size / 1024
    v.memory_bandwidth_gbps = 4800.0
    v.tensorcore_tops = {}
    return v


def install(name: str, capability: tuple[int, int], sm_count: int) -> None:
    """Make Humming see the deployment's GPU as device 0 (build process only; idempotent)."""
    os.environ["HUMMING_DISABLE_PARALLEL_BUILD"] = "1"  # no background helper build at import
    import torch

    if not torch.cuda.is_available():
        torch.cuda.device = lambda *_a, **_k: contextlib.nullcontext()  # type: ignore[assignment]
        torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    import humming.device as hd

    value = device_value(name, capability, sm_count)
    info = object.__new__(hd.DeviceInfo)
    info._index, info._value = 0, value
    hd.DeviceInfo._instances[0] = info
    hd.current_device._value = value
