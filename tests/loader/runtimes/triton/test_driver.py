"""Triton's driver questions answered without building Triton's `cuda_utils` (a gcc build): the device properties
FLA's GDN ops ask for (`get_all_max_shared_mem`, vLLM's own function, run here) come from the CUDA driver's
attributes, the numbers Triton's driver.c reads. On the H200 the unanswered question started ldconfig, gcc and file
in the Qwen3.5 call-site check; in strict mode (gcc refused) FLA swallowed the error and took -1, its
small-shared-memory path: the control shows that."""

from __future__ import annotations

import ctypes

import pytest
import torch

from tests.support.common import needs_vllm
from nojit.loader.errors import CompileForbiddenError
from nojit.loader.runtimes.triton import driver as answered

H200 = {97: 232448, 12: 65536, 16: 132, 10: 32, 13: 1980000, 36: 3201000, 37: 6144, 75: 9, 76: 0}


class FakeLibcuda:
    """cuDeviceGet / cuDeviceGetAttribute as libcuda answers them on an H200 (values of the device's driver)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def cuDeviceGet(self, out, ordinal) -> int:  # noqa: N802 (the driver's name)
        out._obj.value = ordinal
        return 0

    def cuDeviceGetAttribute(self, out, attribute, dev) -> int:  # noqa: N802
        self.asked.append(attribute)
        out._obj.value = H200[attribute]
        return 0


class StrictConfig:
    """Triton's DriverConfig whose real driver cannot be built: strict mode refuses the gcc build of cuda_utils."""

    _default = None

    @property
    def default(self):
        raise CompileForbiddenError("strict mode: gcc was about to build Triton's cuda_utils")


@pytest.fixture
def active(monkeypatch):
    from triton.runtime import driver

    lib = FakeLibcuda()
    monkeypatch.setattr(answered, "_libcuda", lambda: lib)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    previous = driver._active

    def set_active(d):
        driver._active = d
        return d

    yield lib, set_active
    driver._active = previous


def test_device_properties_are_the_driver_attributes_triton_reads(active):
    lib, set_active = active
    d = set_active(answered.TorchAnsweredDriver(StrictConfig()))
    props = d.utils.get_device_properties(0)
    assert props == {"max_shared_mem": 232448, "max_num_regs": 65536, "multiprocessor_count": 132, "warpSize": 32,
                     "sm_clock_rate": 1980000, "mem_clock_rate": 3201000, "mem_bus_width": 6144}
    assert not d.real_driver_created
    with pytest.raises(CompileForbiddenError):  # anything else of utils is Triton's own (refused here)
        d.utils.launch  # noqa: B018


@needs_vllm
def test_fla_reads_the_h200s_shared_memory_without_triton_building_its_driver(active):
    from vllm.third_party.flash_linear_attention.ops import utils as fla

    lib, set_active = active
    d = set_active(answered.TorchAnsweredDriver(StrictConfig()))
    count = fla.device_torch_lib.device_count()
    assert count >= 1
    assert fla.get_all_max_shared_mem() == [232448] * count
    assert 97 in lib.asked and not d.real_driver_created

    # control: the same question passed on to Triton's own driver, as before (strict mode refuses its build):
    # FLA swallows the refusal and reads -1, and takes its small-shared-memory configs
    class Unanswered(answered.TorchAnsweredDriver):
        utils = property(lambda self: getattr(self._real_config.default, "utils"))

    set_active(Unanswered(StrictConfig()))
    assert fla.get_all_max_shared_mem() == [-1]


@pytest.mark.parametrize("missing", ["driver", "libcuda"])
def test_no_driver_is_a_typed_error_naming_the_device(monkeypatch, missing):
    """Without the NVIDIA driver (torch finds none, or libcuda.so.1 cannot be opened) the question is refused with
    nojit's LaunchError naming the device, not torch's RuntimeError or ctypes' OSError from inside nojit."""
    from nojit.loader.errors import LaunchError

    def no_driver():
        raise RuntimeError("Found no NVIDIA driver on your system")

    def no_libcuda():
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")

    if missing == "driver":
        monkeypatch.setattr(torch.cuda, "init", no_driver)
    else:
        monkeypatch.setattr(torch.cuda, "init", lambda: None)
        monkeypatch.setattr(answered, "_libcuda", no_libcuda)
    utils = answered.TorchAnsweredDriver(StrictConfig()).utils
    with pytest.raises(LaunchError) as info:
        utils.get_device_properties(3)
    assert "device 3" in info.value.message and info.value.fix
    assert ("no NVIDIA driver" if missing == "driver" else "libcuda.so.1") in info.value.message
