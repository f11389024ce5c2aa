"""vLLM's own launch code run on the stand-in GPU, every Triton call it makes recorded.

Qwen's kernels have no warmup declarations: vLLM warms them with real launches
(`qwen_triton_warmup.py`, `mamba_triton_warmup.py`) and otherwise reaches them from its layer
code. Here those launch functions run on the stand-in GPU while `JITFunction.run` is replaced by
the Triton room's recorder, so the host code (vLLM's wrappers, Triton's heuristics) decides every
argument exactly as on the GPU. Each recorded call becomes the keyword call a derived row states
(tensors as dtype + 16-byte alignment, the rest as passed); Triton's binder keys it.

The tensors are real CPU tensors made with `torch.empty` (pages never touched unless vLLM's host code
copies them): CPU and CUDA share eager PyTorch's layout rules, which decide the strides the wrappers
pass. FakeTensorMode does not: its `empty_like` of a [8192, 1] view with strides (1, 8192) gives
(1, 1) where eager keeps (1, 8192), and causal_conv1d's `stride_o_token` is a key value (found by
tests/loader/test_qwen_strict_startup.py, whose serving-side launches run eagerly).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.runtimes.triton.enumeration import kernel_id, recording_jit_calls
from nojit.aot.runtimes.triton.rows import Tensor

# Runs vLLM's launch code for one deployment; returns False when the deployment does not reach it (then launching
# nothing is right), None otherwise (then launching nothing is an error).
Launch = Callable[[Deployment, torch.device], "bool | None"]


@contextlib.contextmanager
def stand_in_device() -> Iterator[torch.device]:
    """The device the launch code allocates on: the CPU, with no autograd (as vLLM's inference)."""
    with torch.inference_mode():
        yield torch.device("cpu")


def _argument(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # what a Triton key sees of a tensor: its dtype and 16-byte alignment
        return Tensor(value.dtype, value.data_ptr() % 16 == 0)
    return value


def as_call(fn: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """One recorded JITFunction.run call as keyword arguments (parameters and launch options)."""
    call = {name: _argument(v) for name, v in zip(fn.arg_names, args)}
    call.update({k: _argument(v) for k, v in kwargs.items()})
    return call


def record(d: Deployment, launches: dict[str, Launch]) -> dict[str, list[dict[str, Any]]]:
    """Run each launch (name -> function) and group the recorded calls by kernel id."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name, launch in launches.items():
        with recording_jit_calls() as calls, stand_in_device() as device:
            try:
                reached = launch(d, device) is not False
            except BuildError:
                raise
            except Exception as exc:
                raise BuildError(f"vLLM's launch code {name} failed on the stand-in GPU: {type(exc).__name__}: {exc}",
                                 fix="check the deployment values; if they are right, report this to nojit") from exc
        if not calls and reached:
            raise BuildError(f"vLLM's launch code {name} launched no Triton kernel",
                             fix="report this to nojit with the vLLM version")
        for fn, args, kwargs in calls:
            out[kernel_id(fn)].append(as_call(fn, args, kwargs))
    return dict(out)


class Recorded:
    """The recorded calls of one set of launches, per deployment (run once, read by every row)."""

    def __init__(self, launches: dict[str, Launch], kernels: tuple[str, ...]) -> None:
        self.launches, self.kernels = launches, kernels
        self._cache: dict[int, tuple[Deployment, dict[str, list[dict[str, Any]]]]] = {}

    def calls(self, d: Deployment) -> dict[str, list[dict[str, Any]]]:
        hit = self._cache.get(id(d))
        if hit is None or hit[0] is not d:
            recorded = record(d, self.launches)
            unknown = sorted(set(recorded) - set(self.kernels))
            if unknown:  # a kernel vLLM reached that no row names would be dropped silently
                raise BuildError(f"vLLM's launch code reached Triton kernels the Qwen rows do not name: {unknown}",
                                 fix="add them to the kernel list of aot/models/qwen3_5/derived.py")
            hit = self._cache[id(d)] = (d, recorded)
        return hit[1]

    def of(self, kernel: str) -> Callable[[Deployment], list[dict[str, Any]]]:
        return lambda d: self.calls(d).get(kernel, [])
