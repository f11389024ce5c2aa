"""Enumerate the TileLang kernel variants a vLLM model compiles, keyed as TileLang keys them.

vLLM declares its mHC variants through warmup owners (``_MHC_PRE_BIG_FUSE_TILELANG_KERNEL`` ...): the
model registers them with its config, ``get_warmup_keys`` expands the registrations into owner
CompileKeys, and ``owner.compile(key)`` runs the owner's real ``__call__`` which ends in
``jit_impl.compile(*args, **kwargs)`` followed by ``jit_impl._kernel_cache[parse_args(...)] = kernel``.
We replay exactly that: the model's registrations go into vLLM's own ``JitWarmupRegistry`` and its
``warmup()`` runs, with ``JITImpl.compile`` swapped for a recorder. So the variant set, the call
vLLM makes and the in-memory key TileLang files it under all come from vLLM and TileLang; nothing
here re-derives their logic. Nothing is compiled; only TileLang's phase-1 elaboration runs.

Call ``nojit.aot.vllm_env.install_deployment_platform(facts)`` before using this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

from nojit.aot.vllm_env import import_kernel_module, installed_platform
from nojit.aot.errors import BuildError
from nojit.loader.resolve import resolve_object

OWNERS_MODULE = "vllm.model_executor.kernels.mhc.tilelang_kernels"

# Attribute names of vLLM's owner singletons in OWNERS_MODULE.
PRE_BIG_FUSE = "_MHC_PRE_BIG_FUSE_TILELANG_KERNEL"
PRENORM_GEMM = "_HC_PRENORM_GEMM_TILELANG_KERNEL"
POST = "_MHC_POST_TILELANG_KERNEL"
FUSED = "_MHC_FUSED_TILELANG_KERNEL"
HC_HEAD = "_HC_HEAD_FUSED_TILELANG_KERNEL"
OWNER_NAMES = (PRE_BIG_FUSE, PRENORM_GEMM, POST, FUSED, HC_HEAD)

Register = Callable[[Any, Any], None]  # (vLLM's mHC kernel module, vllm_config) -> None


@dataclass(frozen=True)
class TileLangCall:
    """One TileLang specialization vLLM compiles, as plain picklable data (no vLLM/TileLang objects).

    ``key`` is the exact ``JITImpl._kernel_cache`` key, ``(phase1, phase2)``: phase 1 is every
    non-tensor parameter of the kernel function in signature order with defaults filled in.
    ``compile_kwargs`` are those same parameters by name, for ``jit_impl.compile(**kwargs)``.
    ``call_args``/``call_kwargs`` name the parameters vLLM passed positionally / by keyword;
    ``defaults`` are the signature defaults of the non-tensor parameters, which fill the key when a
    call omits them (so a loader can key a call with neither TileLang nor introspection).
    """

    kernel: str
    key: tuple[Any, ...]
    compile_kwargs: tuple[tuple[str, Any], ...]
    owner: str
    compile_key: tuple[tuple[str, Any], ...]
    call_args: tuple[str, ...]
    call_kwargs: tuple[str, ...]
    defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def phase1_key(self) -> tuple[Any, ...]:
        return self.key[0]

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.compile_kwargs)

    @property
    def function_name(self) -> str:
        return self.kernel.rsplit(":", 1)[1].rsplit(".", 1)[-1]

    @property
    def variant_id(self) -> str:
        """Stable short name: function name plus a digest of (kernel, key)."""
        digest = hashlib.sha256(repr((self.kernel, self.key)).encode()).hexdigest()[:12]
        return f"{self.function_name}-{digest}"


def resolve(qualified: str) -> Any:
    """The live object named ``"module:attr"`` (dots allowed in attr)."""
    return resolve_object(qualified)


def kernel_module() -> Any:
    """Import vLLM's mHC kernel module, checking it saw the deployment platform at import.

    ``ENABLE_PDL`` (emits griddepcontrol in every kernel) and ``_MIX_ON_TRAILING_THREADS`` (ROCm
    thread layout) are module globals computed from ``current_platform`` when the module is first
    imported; they change the generated code without entering any TileLang key.
    """
    facts = installed_platform()
    if facts is None:
        raise BuildError(
            "the deployment platform is not installed", fix="call install_deployment_platform(facts) first"
        )
    tk = importlib.import_module(OWNERS_MODULE)
    if bool(tk.ENABLE_PDL) != facts.pdl or tk._MIX_ON_TRAILING_THREADS:
        raise BuildError(
            f"{OWNERS_MODULE} was imported with ENABLE_PDL={tk.ENABLE_PDL}, "
            f"_MIX_ON_TRAILING_THREADS={tk._MIX_ON_TRAILING_THREADS}; the deployment says pdl={facts.pdl} on CUDA",
            fix="install the deployment platform before anything imports vLLM's kernel modules",
        )
    return tk


def kernel_identity(jit_impl: Any) -> str:
    fn = jit_impl.func.orig_func
    return f"{fn.__module__}:{fn.__qualname__}"


@dataclass
class _Recorded:
    """What one intercepted ``JITImpl.compile`` call saw; stands in for the compiled kernel."""

    jit_impl: Any
    owner: str
    compile_key: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@contextlib.contextmanager
def _recording_compiles(tk: Any, owner_names: list[str]) -> Iterator[list[TileLangCall]]:
    """Swap ``JITImpl.compile`` for a recorder while vLLM's warmup runs.

    The recorder does what the real ``compile`` does before lowering (``initialize_jit_mode``, so
    ``parse_args`` can elaborate) and returns a ``_Recorded``; vLLM's ``compile_tilelang`` then
    files it under TileLang's own key. Each record is read back when the next compile starts (and
    at the end), before another owner key could overwrite the same cache slot.
    """
    from tilelang.jit import JITImpl

    owners = {name: getattr(tk, name) for name in owner_names}
    variants: list[TileLangCall] = []
    pending: list[_Recorded] = []

    def record(self: Any, *args: Any, **kwargs: Any) -> _Recorded:
        if pending:
            variants.append(_variant(pending.pop()))
        warming = [(name, o._warming_key) for name, o in owners.items() if o._warming_key is not None]
        if len(warming) != 1:
            raise BuildError(f"TileLang compile outside exactly one vLLM owner warmup: {warming}")
        self.initialize_jit_mode(*args, **kwargs)
        rec = _Recorded(self, f"{OWNERS_MODULE}:{warming[0][0]}", warming[0][1], args, dict(kwargs))
        pending.append(rec)
        return rec

    original = JITImpl.compile
    JITImpl.compile = record  # type: ignore[method-assign]
    try:
        yield variants
    finally:
        JITImpl.compile = original  # type: ignore[method-assign]
    if pending:
        variants.append(_variant(pending.pop()))


def _take_key(rec: _Recorded) -> tuple[Any, ...]:
    """Pop the entry vLLM's ``compile_tilelang`` filed for this record; its key is TileLang's."""
    cache = rec.jit_impl._kernel_cache
    keys = [k for k, v in cache.items() if v is rec]
    if len(keys) != 1:
        raise BuildError(f"expected vLLM to file one TileLang cache entry per compile, found {len(keys)}")
    del cache[keys[0]]
    return keys[0]


def _variant(rec: _Recorded) -> TileLangCall:
    jit_impl = rec.jit_impl
    key = _take_key(rec)
    p1_key, _tensors, compile_kwargs = jit_impl.func._parse_phase1_key(*rec.args, **rec.kwargs)
    if p1_key != key[0]:
        raise BuildError(f"TileLang phase-1 key {p1_key!r} differs from its cache key {key!r}")
    # The variant is compiled later from kwargs alone: check TileLang files that call under the same key.
    kw_key, _ = jit_impl.func.parse_args(**compile_kwargs)
    if kw_key != key:
        raise BuildError(f"compile(**kwargs) keys as {kw_key!r}, vLLM's call as {key!r}")
    params = jit_impl.signature.parameters
    names = list(params)
    return TileLangCall(
        kernel=kernel_identity(jit_impl),
        key=key,
        compile_kwargs=tuple(compile_kwargs.items()),
        owner=rec.owner,
        compile_key=tuple((f.name, getattr(rec.compile_key, f.name)) for f in fields(rec.compile_key)),
        call_args=tuple(names[: len(rec.args)]),
        call_kwargs=tuple(rec.kwargs),
        defaults=tuple((n, p.default) for n, p in params.items()
                       if n not in jit_impl.func.tensor_args and p.default is not p.empty),
    )


def enumerate_mhc_variants(register: Register, max_num_batched_tokens: int, deep_gemm: bool) -> list[TileLangCall]:
    """Every TileLang variant vLLM's warmup compiles after the model's `register` calls, deduplicated
    by (kernel, key).

    `register(tk, vllm_config)` makes the model's ``register_warmup`` calls on vLLM's owners in ``tk``
    (the model's own module says which, with the lines it read them from). ``deep_gemm`` is what
    ``is_deep_gemm_supported()`` answers on the deployment. The SM count behind the split choice and
    the PDL flag baked into the kernels come from the installed platform facts.
    """
    tk = kernel_module()
    facts = installed_platform()
    if facts is None or facts.deep_gemm != deep_gemm:
        raise BuildError(f"deep_gemm={deep_gemm} contradicts the installed platform facts ({facts})")
    # JitWarmupRegistry.warmup() imports vLLM's Triton warmup helper; like the other non-TileLang vLLM
    # modules it is imported under vLLM's neutral platform (vllm_env's rule).
    import_kernel_module("vllm.model_executor.warmup.jit_warmup_triton_helper")
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    # get_warmup_keys reads only scheduler_config.max_num_batched_tokens from the config.
    vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=max_num_batched_tokens))
    registry = JitWarmupRegistry(vllm_config)
    with registry.activate():
        register(tk, vllm_config)
    owner_names = list(OWNER_NAMES)
    with _recording_compiles(tk, owner_names) as recorded:
        registry.warmup()
    variants: dict[tuple[str, Any], TileLangCall] = {}
    for v in recorded:
        variants.setdefault((v.kernel, v.key), v)
    return list(variants.values())
