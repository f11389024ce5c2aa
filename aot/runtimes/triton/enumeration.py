"""Enumerate the Triton keys a deployment will launch, by letting vLLM's own warmup code run.

For every owner row, vLLM's `get_warmup_keys(...)` expands the registration into its
CompileKeys and `owner.compile(key)` runs vLLM's real launch path with its warmup inputs,
ending in `JITFunction.run(..., warmup=True)`. During enumeration that method is replaced
by a recorder: each call's arguments go through Triton's own binder (the JIT's key rule)
to give the exact key, and nothing is compiled yet. Whatever JITFunction vLLM launches is
recorded under its own identity, even one the table did not name.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.runtimes.triton.autotune import Tuning, recording_autotuners
from nojit.aot.runtimes.triton.compiler import key_for_call
from nojit.aot.runtimes.triton.rows import DerivedKernel, TritonOwner, TritonSite
from nojit.aot.runtimes.triton.source_parts import source_parts
from nojit.aot.runtimes.triton.sources import resolve_kernel
from nojit.aot.vllm_env import import_kernel_module
from nojit.loader.errors import BundleMismatchError, NoJitError
from nojit.loader.resolve import jit_function_of, resolve_object
from nojit.loader.bundle.triton_key import Key, UnsupportedArgument


def kernel_id(fn: Any) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


@dataclass(frozen=True)
class TritonRequest:
    """One key to compile, where it came from, and the call that produced it."""

    kernel: str
    key: Key
    origin: str
    sample: dict[str, Any] | None = None
    tuning: Tuning | None = None  # the call came from Triton's Autotuner (one of the tuning key's configs)


@dataclass
class TritonKernelInfo:
    """What the bundle records about a kernel besides its entries."""

    id: str
    source_hash: str
    params: tuple[str, ...]
    info: dict[str, Any] = field(default_factory=dict)


def describe_value(v: Any) -> dict[str, Any]:
    """A portable description of one launch argument (for device checks and reports)."""
    cls = type(v).__name__
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"value": v}
    dtype = getattr(v, "dtype", None)
    if dtype is not None and hasattr(v, "data_ptr"):
        desc: dict[str, Any] = {"tensor": str(dtype).removeprefix("torch."), "aligned": v.data_ptr() % 16 == 0}
        shape = getattr(v, "shape", None)
        if shape is not None:
            desc["shape"] = [int(s) for s in shape]
            try:
                desc["strides"] = [int(s) for s in v.stride()]
            except Exception:
                pass
        return desc
    return {"repr": f"{cls}:{v!r:.120}"}


@contextlib.contextmanager
def recording_jit_calls() -> Iterator[list[tuple[Any, tuple, dict]]]:
    """Replace JITFunction.run (class-wide, build process only) by a recorder."""
    from triton.runtime.jit import JITFunction

    calls: list[tuple[Any, tuple, dict]] = []
    original = JITFunction.run

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        calls.append((self, args, kwargs))
        return None

    JITFunction.run = record
    try:
        yield calls
    finally:
        JITFunction.run = original


def resolve_owner(path: str) -> Any:
    return resolve_object(path, import_module=import_kernel_module)


def _call_get_warmup_keys(owner: Any, registration: dict[str, Any], vllm_config: Any) -> list[Any]:
    kwargs = dict(registration)
    params = inspect.signature(owner.get_warmup_keys).parameters
    # JitWarmupRegistry.warmup()'s own rule: a bare registration gets vllm_config injected.
    if not kwargs and "vllm_config" in params:
        kwargs = {"vllm_config": vllm_config}
    elif "vllm_config" in params and "vllm_config" not in kwargs:
        kwargs["vllm_config"] = vllm_config
    return list(owner.get_warmup_keys(**kwargs))


def enumerate_owner(owner_row: TritonOwner, deployment: Deployment, vllm_config: Any) -> list[TritonRequest]:
    """All keys vLLM declares for one owner row in this deployment."""
    registrations = owner_row.registrations(deployment)
    if not registrations:
        return []
    try:
        owner = resolve_owner(owner_row.owner)
    except BundleMismatchError as exc:
        raise BuildError(f"vLLM has no warmup owner {owner_row.owner}: {exc.message}",
                         fix="this nojit's kernel table is for vLLM 0.33.0; install that version") from None
    out: list[TritonRequest] = []
    for registration in registrations:
        try:
            compile_keys = _call_get_warmup_keys(owner, registration, vllm_config)
        except NoJitError:
            raise
        except Exception as exc:
            raise BuildError(
                f"vLLM's get_warmup_keys for {owner_row.owner} failed with {registration or 'no arguments'}: "
                f"{type(exc).__name__}: {exc}",
                fix="check the deployment values; if they are right, report this to nojit",
            ) from exc
        for ck in compile_keys:
            with recording_jit_calls() as calls, recording_autotuners(calls) as tuned:
                try:
                    owner.compile(ck)
                except NoJitError:
                    raise
                except Exception as exc:
                    raise BuildError(
                        f"vLLM's warmup launch for {owner_row.owner} key {ck} failed: {type(exc).__name__}: {exc}",
                        fix="report this to nojit with the vLLM version",
                    ) from exc
            if not calls:
                raise BuildError(f"{owner_row.owner} key {ck} launched no Triton kernel during warmup",
                                 fix="report this to nojit with the vLLM version")
            out.extend(_requests(calls, tuned, f"registry:{owner_row.owner}"))
    return out


def enumerate_calls(thunk: Any, origin: str) -> list[TritonRequest]:
    """Every Triton call a Python callable makes (a call site run on the stand-in GPU), keyed as the JIT
    would; calls that reach an Autotuner carry its tuning key and pruned configs."""
    with recording_jit_calls() as calls, recording_autotuners(calls) as tuned:
        thunk()
    return _requests(calls, tuned, origin)


def enumerate_site(site: TritonSite, deployment: Deployment) -> list[TritonRequest]:
    """Every Triton call one call site row makes for this deployment (autotuned ones with their tuning keys);
    a kernel the row does not name, or a reached site that launches nothing, is an error."""
    reached: list[bool] = []
    try:
        requests = enumerate_calls(lambda: reached.append(site.run(deployment) is not False), f"site:{site.site}")
    except (BuildError, NoJitError):
        raise
    except Exception as exc:
        raise BuildError(f"vLLM's call site {site.site} failed on the stand-in GPU: {type(exc).__name__}: {exc}",
                         fix="check the deployment values; if they are right, report this to nojit") from exc
    unknown = sorted({r.kernel for r in requests} - set(site.kernels))
    if unknown:
        raise BuildError(f"vLLM's call site {site.site} reached Triton kernels its row does not name: {unknown}",
                         fix="add them to the row's kernels in the model's tables (aot/models/)")
    if not requests and reached and reached[0]:
        raise BuildError(f"vLLM's call site {site.site} launched no Triton kernel",
                         fix="report this to nojit with the vLLM version")
    return requests


def _requests(calls: list[tuple[Any, tuple, dict]], tuned: dict[int, Tuning], origin: str) -> list[TritonRequest]:
    out = []
    for i, (fn, args, kwargs) in enumerate(calls):
        tuning = tuned.get(i)
        out.append(_request(fn, args, kwargs, origin,
                            tuning if tuning is not None and tuning.kernel == kernel_id(fn) else None))
    return out


def _request(fn: Any, args: tuple, kwargs: dict, origin: str, tuning: Tuning | None = None) -> TritonRequest:
    try:
        key = key_for_call(fn, args, kwargs)
    except UnsupportedArgument as exc:
        raise BuildError(f"{kernel_id(fn)}: {exc}", fix="this kernel cannot be bundled yet; leave it out") from None
    names = [p.name for p in fn.params]
    sample = {name: describe_value(v) for name, v in zip(names, args)}
    sample.update({k: describe_value(v) for k, v in kwargs.items()})
    return TritonRequest(kernel_id(fn), key, origin, sample, tuning)


def kernel_info(fn: Any, owner: str | None, site: str) -> TritonKernelInfo:
    info: dict[str, Any] = {
        "constexpr": [p.num for p in fn.params if p.is_constexpr],
        "do_not_specialize": [p.num for p in fn.params if p.do_not_specialize],
        "do_not_specialize_on_alignment": [p.num for p in fn.params if p.do_not_specialize_on_alignment],
        "file": _package_relative(inspect.getsourcefile(fn.fn) or ""),
        "site": site,
    }
    if owner is not None:
        info["owner"] = owner
    record_source_parts(fn, info)
    return TritonKernelInfo(kernel_id(fn), fn.cache_key, tuple(p.name for p in fn.params), info)


def record_source_parts(fn: Any, info: dict[str, Any]) -> None:
    """What the kernel's cache_key was made of (the loader's cheap exact source check; absent: it uses cache_key)."""
    parts = source_parts(fn)
    if parts is None:
        info.pop("source_parts", None)
    else:
        info["source_parts"] = parts


def _package_relative(path: str) -> str:
    """A source path relative to the directory holding its top-level package (vllm/...), so the
    manifest does not depend on where the environment is installed."""
    import vllm

    root = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else path


def enumerate_derived(derived: DerivedKernel, deployment: Deployment) -> list[TritonRequest]:
    """Keys of a kernel nojit derives from its call site (see rows.DerivedKernel)."""
    fn = jit_function_of(resolve_kernel(derived.kernel, None))
    if fn is None:
        raise BuildError(f"{derived.kernel} is not a Triton JITFunction", fix="fix the derived row in the model's tables (aot/models/)")
    out = []
    for kwargs in derived.calls(deployment):
        try:
            out.append(_request(fn, (), dict(kwargs), f"derived:{derived.site}"))
        except (TypeError, OverflowError) as exc:
            raise BuildError(f"derived call of {derived.kernel} does not bind: {exc}",
                             fix="fix the derived row in the model's tables (aot/models/)") from None
    return out


def dedupe(requests: list[TritonRequest]) -> list[TritonRequest]:
    """First request per (kernel, key, tuning key) wins; order is kept."""
    seen: set[tuple[str, Key, Any]] = set()
    out = []
    for r in requests:
        ident = (r.kernel, r.key, r.tuning.key if r.tuning is not None else None)
        if ident not in seen:
            seen.add(ident)
            out.append(r)
    return out

