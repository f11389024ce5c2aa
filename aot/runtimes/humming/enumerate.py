"""Which Humming kernels the deployment's routed experts reach, as Humming itself would build them.

vLLM 0.33.0 on sm_90 runs DeepSeek-V4-Flash's MXFP4 experts with Humming (fused_moe/oracle/mxfp4.py:438-462:
HUMMING is moved ahead of MARLIN by humming/priority.py; `select_deepseek_v4_mxfp4_moe_backend`). Without expert
parallelism vLLM picks `HummingIndexedExperts` (fused_humming_moe.py: `get_humming_moe_gemm_type` -> "indexed").
Every forward then asks Humming for:
  * the two GEMMs (w13: N = 2 * moe_intermediate / TP, K = hidden; w2: N = hidden, K = moe_intermediate / TP),
    each with the tuning table vLLM computed once (`get_heuristics_config(layer_config, ...)` in
    `init_humming_moe`); Humming's `HummingKernel.prepare_kernels` compiles one kernel per interval of that table
    at the first call (kernel/humming.py), so every interval's kernel is reached whatever M is;
  * the input processing of the w2 GEMM (`may_process_input` -> ops/input.py `_prepare_process_input_op`):
    clamped SiLU * up and block-FP8 quantization; again Humming compiles one kernel per tuning interval
    (`ProcessInputKernel.prepare_kernels`). The w13 input is not Humming's to process when vLLM quantizes it
    before the dispatch (block-FP8 activations: `_prequantizes_dispatch_activation`, asked of vLLM here).

Before that, at weight loading, vLLM's MXFP4 path (quantization/utils/humming/moe.py `_prepare_and_transform_sublayer`)
runs Humming's weight transform (`prepare_and_transform_humming_tensors`) for w13 and w2, whose ops construct their
kernels directly (ProcessMxfp4W4A8Kernel, RepackWeightKernel): `transform_kernels` runs that transform on CPU tensors
and records each construction.

The layer configs come from Humming's and vLLM's own functions (`Mxfp4WeightSchema`, vLLM's
`_humming_input_schema` + `check_and_fallback_input_schema`, Humming's `prepare_layer_config`), the tables from
Humming's heuristics on a stand-in of the deployment's GPU (standin.py), and the kernel list from Humming's own
`prepare_kernels`, with its `compile_many` replaced by a recorder: each (kernel class, constructor arguments) it
would compile is one bundle key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.runtimes.humming import standin
from nojit.aot.runtimes.humming.tables import MoeExperts
from nojit.aot.vllm_env import import_kernel_module
from nojit.loader.runtimes.humming.serving import kernel_key

@dataclass(frozen=True)
class KernelSpec:
    """One kernel Humming compiles: its class ("module:qualname"), the arguments it is constructed with
    (JSON, exactly what Humming passes) and the op of the MoE layer that reaches it."""

    kernel_class: str
    args: dict[str, Any]
    op: str  # "w13" | "w2" | "input:w13" | "input:w2" | "transform:w13" | "transform:w2"

    def key(self) -> dict[str, Any]:
        return {"class": self.kernel_class, "args": self.args}


class _Recorder:
    """Stands in for `KernelRuntime.compile_many` while Humming's own prepare_kernels runs."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.specs: list[KernelSpec] = []

    def __call__(self, kernel_specs: Any, device: Any = None) -> list[Any]:
        out = []
        for cls, args in kernel_specs:
            key = kernel_key(cls, args)
            self.specs.append(KernelSpec(key["class"], key["args"], self.op))
            out.append(type("Recorded", (), {"kernel_id": len(self.specs)})())
        return out


def tp_shapes(d: Deployment, moe: MoeExperts) -> tuple[int, int]:
    """(hidden, intermediate per TP rank), after vLLM's MXFP4 round-up for the Humming backend."""
    tp = d.tensor_parallel_size
    if moe.intermediate % tp:
        raise BuildError(f"moe_intermediate_size {moe.intermediate} is not divisible by tensor_parallel_size {tp}",
                         fix="use a tensor-parallel size that divides the experts' intermediate size")
    oracle = import_kernel_module("vllm.model_executor.layers.fused_moe.oracle.mxfp4")
    return oracle.mxfp4_round_up_hidden_size_and_intermediate_size(
        oracle.Mxfp4MoeBackend.HUMMING, moe.hidden, moe.intermediate // tp)


def enumerate_kernels(d: Deployment, layers: list[MoeExperts]) -> list[KernelSpec]:
    """Every Humming kernel the deployment's routed experts reach (needs the deployment platform installed)."""
    p = d.platform
    standin.install(p.device_name, p.capability, p.sm_count)
    specs: list[KernelSpec] = []
    for moe in layers:
        specs += _layer_kernels(d, moe) + transform_kernels(d, moe)
    unique: dict[str, KernelSpec] = {}
    for s in specs:  # Humming's KernelRuntime keeps one object per (class, arguments): one compile each
        unique.setdefault(json.dumps(s.key(), sort_keys=True), s)
    return list(unique.values())


@dataclass(frozen=True)
class PrepareCall:
    """One call the serving process makes into Humming at the first forward: `HummingKernel.prepare_kernels(layer,
    compute, tuning, device)` (humming_forward -> ops.humming_gemm) or `ProcessInputKernel.prepare_kernels(config,
    intervals, device, key)` (may_process_input -> ops.process_input). `run()` makes it."""

    op: str
    kernel_class: type
    args: tuple[Any, ...]

    def run(self) -> Any:
        return self.kernel_class.prepare_kernels(*self.args)


def prepare_calls(d: Deployment, moe: MoeExperts) -> list[PrepareCall]:
    """The Humming calls of one MoE layer kind, with vLLM's and Humming's own configuration code (needs the
    deployment platform and the Humming stand-in device where there is no GPU)."""
    activation_mod = import_kernel_module("vllm.model_executor.layers.fused_moe.activation")
    hact = import_kernel_module("vllm.model_executor.layers.quantization.utils.humming.activation")
    from humming.config import ActivationType, ProcessInputLayoutType, ProcessInputProblemConfig
    from humming.dtypes import DataType
    from humming.kernel.humming import HummingKernel
    from humming.kernel.process_input import ProcessInputKernel
    from humming.transform import prepare_layer_config
    from humming.tune import get_heuristics_class, get_heuristics_config
    from humming.tune.process_input import get_process_input_tuning_intervals

    hidden, inter = tp_shapes(d, moe)
    param_dtype, weight_schema, input_schema = layer_schemas(d, moe)
    # HummingExpertsBase.init_humming_moe: compute config and one tuning table per sublayer.
    compute = {"use_batch_invariant": False, "use_f16_accum": False, "gemm_type": "indexed"}
    act_config = activation_mod.ApplyMoEActivationConfig(clamp_limit=moe.clamp_limit)
    activation = hact.get_humming_activation(activation_mod.MoEActivation[moe.activation], act_config)

    layers = {sub: prepare_layer_config(shape_n=n, shape_k=k, weight_schema=weight_schema, input_schema=input_schema,
                                        num_experts=moe.experts, pad_n_to_multiple=256, pad_k_to_multiple=128,
                                        has_bias=False, torch_dtype=param_dtype, device=0)
              for sub, n, k in (("w13", 2 * inter, hidden), ("w2", hidden, inter))}
    prequantized = _w13_input_quantized_by_vllm(weight_schema, input_schema, layers)
    calls: list[PrepareCall] = []
    for sub, layer in layers.items():
        table = get_heuristics_config(layer_config=layer, use_f16_accum=False, use_batch_invariant=False,
                                      gemm_type="indexed")
        calls.append(PrepareCall(sub, HummingKernel, (layer.to_str(), json.dumps(compute), json.dumps(table), 0)))
        if sub == "w13" and prequantized:
            continue  # vLLM quantized it before the dispatch: Humming's process_input returns at once
        # The input of this GEMM: may_process_input -> _prepare_process_input_op (ops/input.py), vLLM's
        # arguments from HummingExpertsBase.process_input (layout "normal": no expert map, so no scatter).
        binary = sub == "w2"
        act_type = ActivationType(activation["activation_type"] if binary else "none")  # vLLM's MoEActivation
        config = ProcessInputProblemConfig(
            input_dtype=DataType.from_torch_dtype(param_dtype),  # hidden states, and w13's bf16 output
            hidden_size=layer.shape_k - layer.pad_shape_k,
            quant_mode=layer.input_quant_mode.value, quant_dtype=layer.a_dtype.dtype_str,
            quant_group_size=layer.input_scale_group_size or None, group_scale_dtype=layer.as_dtype.dtype_str,
            activation_type=act_type, activation_impl=activation["activation_impl"] if binary else None,
            hadamard_block_size=weight_schema.hadamard_block_size,  # vLLM passes the schema's value (0)
            layout=ProcessInputLayoutType("normal"), scatter_width=1, zero_invalid=False,
            use_m_major_input_scale=False)
        use_pdl = get_heuristics_class(0).should_use_pdl_for_input(layer, 1)  # sm_90: False at every M
        calls.append(PrepareCall(f"input:{sub}", ProcessInputKernel,
                                 (config, get_process_input_tuning_intervals(config, use_pdl), 0, (0, config, use_pdl))))
    return calls


def layer_schemas(d: Deployment, moe: MoeExperts) -> tuple[Any, Any, Any]:
    """(param dtype, Humming weight schema, Humming input schema) of the layer, as vLLM's MXFP4 path computes them."""
    import torch

    oracle = import_kernel_module("vllm.model_executor.layers.fused_moe.oracle.mxfp4")
    hschema = import_kernel_module("vllm.model_executor.layers.quantization.utils.humming.schema")
    quant_utils = import_kernel_module("vllm.model_executor.layers.quantization.utils.quant_utils")
    from humming.schema import BaseWeightSchema

    param_dtype = torch.bfloat16 if d.dtype == "bfloat16" else torch.float16
    weight_schema = BaseWeightSchema.from_config({"quant_method": moe.weight_quant_method}).to_humming_schema(param_dtype)
    # The deployment passes no `--quantization-config` MoE activation override (`_user_moe_activation_override`).
    original_override = oracle._user_moe_activation_override
    oracle._user_moe_activation_override = lambda: None
    try:
        input_schema = oracle._humming_input_schema(getattr(quant_utils, moe.activation_key))
    finally:
        oracle._user_moe_activation_override = original_override
    input_schema = hschema.check_and_fallback_input_schema(weight_schema=weight_schema, input_schema=input_schema,
                                                           param_dtype=param_dtype, allow_fallback=False)
    return param_dtype, weight_schema, input_schema


# ------------------------------------------------------------------------------------------------ weight transform
# vLLM's weight loading (quantization/utils/humming/moe.py `_prepare_and_transform_sublayer`) hands each sublayer's
# tensors to Humming's `prepare_and_transform_humming_tensors`, whose ops (humming/ops/weight.py) construct their
# kernels directly (`ProcessMxfp4W4A8Kernel()`, `RepackWeightKernel(...)`), not through compile_many.


@dataclass(frozen=True)
class TransformCall:
    """One sublayer's call into Humming's weight transform with vLLM's arguments; `run(tensors)` makes it."""

    op: str  # "transform:w13" | "transform:w2"
    kwargs: dict[str, Any]  # prepare_and_transform_humming_tensors' arguments besides `tensors`

    def tensors(self, num_experts: int = 1) -> dict[str, Any]:
        """Weight tensors of the layout the call expects (Humming's own `get_tensors_attrs`), for `num_experts`."""
        import torch

        attrs = self.kwargs["weight_schema"].get_tensors_attrs(
            shape_n=self.kwargs["shape_n"], shape_k=self.kwargs["shape_k"], param_dtype=self.kwargs["torch_dtype"],
            num_experts=num_experts, has_bias=self.kwargs["has_bias"])
        out = {}
        for name, a in attrs.items():
            if a["dtype"] == torch.float8_e8m0fnu:  # scale 1.0
                out[name] = torch.full(a["shape"], 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
            else:
                out[name] = torch.zeros(a["shape"], dtype=a["dtype"])
        return out

    def run(self, tensors: dict[str, Any], num_experts: int | None = None) -> Any:
        from humming.transform import prepare_and_transform_humming_tensors

        kwargs = dict(self.kwargs)
        if num_experts is not None:
            kwargs["num_experts"] = num_experts
        return prepare_and_transform_humming_tensors(tensors=tensors, **kwargs)


def transform_calls(d: Deployment, moe: MoeExperts) -> list[TransformCall]:
    """vLLM's `_prepare_and_transform_sublayer` arguments for w13 and w2 of one MoE layer kind."""
    hidden, inter = tp_shapes(d, moe)
    param_dtype, weight_schema, input_schema = layer_schemas(d, moe)
    return [TransformCall(f"transform:{sub}", dict(
        shape_n=n, shape_k=k, pad_n_to_multiple=256, pad_k_to_multiple=128, input_schema=input_schema,
        weight_schema=weight_schema, has_bias=False, num_experts=moe.experts, torch_dtype=param_dtype, device=0))
        for sub, n, k in (("w13", 2 * inter, hidden), ("w2", hidden, inter))]


def _looks_cuda() -> type:
    import torch

    class LooksCuda(torch.Tensor):
        """A CPU tensor that passes Humming's ops' `inputs.is_cuda` asserts, so the transform's torch code runs
        here and reaches the kernel constructions, which are recorded instead of built."""

        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

    return LooksCuda


def transform_kernels(d: Deployment, moe: MoeExperts) -> list[KernelSpec]:
    """Every kernel Humming's weight transform constructs for this layer kind: Humming's own transform runs on CPU
    tensors of one expert (no kernel argument depends on the expert count: checked on the layer config), with each
    kernel class of humming.ops replaced by a recorder of (class, constructor arguments)."""
    import dataclasses
    import sys

    import humming.ops  # noqa: F401
    from humming.jit.runtime import KernelRuntime
    from humming.transform import prepare_layer_config

    looks_cuda = _looks_cuda()
    specs: list[KernelSpec] = []
    modules = [m for name, m in list(sys.modules.items()) if name.startswith("humming.ops.") and m is not None]
    originals: list[tuple[Any, str, type]] = []
    current: list[str] = [""]

    def recorder(cls: type) -> Any:
        def construct(*args: Any, **kwargs: Any) -> Any:
            if args:
                raise BuildError(f"Humming constructs {cls.__name__} with positional arguments {args!r}",
                                 fix="update enumerate.py for this humming-kernels version")
            key = kernel_key(cls, kwargs)
            specs.append(KernelSpec(key["class"], key["args"], current[0]))
            return lambda *a, **k: None  # the launch: nothing to compute here
        return construct

    for m in modules:
        for name, obj in list(vars(m).items()):
            if isinstance(obj, type) and issubclass(obj, KernelRuntime) and obj is not KernelRuntime:
                originals.append((m, name, obj))
                setattr(m, name, recorder(obj))
    try:
        for call in transform_calls(d, moe):
            current[0] = call.op
            real = prepare_layer_config(**call.kwargs)
            one = prepare_layer_config(**{**call.kwargs, "num_experts": 1})
            if dataclasses.replace(real, num_experts=1) != one:
                raise BuildError(f"{call.op}: Humming's layer config depends on the expert count beyond num_experts",
                                 fix="run the transform enumeration with the real expert count")
            tensors = {k: v.as_subclass(looks_cuda) for k, v in call.tensors(1).items()}
            call.run(tensors, num_experts=1)
    finally:
        for m, name, obj in originals:
            setattr(m, name, obj)
    return specs


def _layer_kernels(d: Deployment, moe: MoeExperts) -> list[KernelSpec]:
    """Each call's kernels, recorded where Humming's prepare_kernels hands them to compile_many."""
    from humming.jit.runtime import KernelRuntime

    specs: list[KernelSpec] = []
    calls = prepare_calls(d, moe)
    original = KernelRuntime.__dict__["compile_many"]
    try:
        for call in calls:
            rec = _Recorder(call.op)
            KernelRuntime.compile_many = staticmethod(rec)
            call.kernel_class._str2kernel_cache.clear()  # a cached call hands nothing to compile_many
            call.run()
            specs += rec.specs
    finally:
        KernelRuntime.compile_many = original
        for call in calls:  # the recorder's stand-in kernel ids must not answer a later call
            call.kernel_class._str2kernel_cache.clear()
    return specs


def _w13_input_quantized_by_vllm(weight_schema: Any, input_schema: Any, layers: dict[str, Any]) -> bool:
    """vLLM's own answer: block-FP8 activations are quantized by the prepare step (before the dispatch) and the
    experts get a1q_scale (HummingExpertsBase._prequantizes_dispatch_activation on the quant config that
    get_humming_moe_quant_config builds from the layer's schemas)."""
    import types

    hmoe = import_kernel_module("vllm.model_executor.layers.quantization.utils.humming.moe")
    experts = import_kernel_module("vllm.model_executor.layers.fused_moe.experts.fused_humming_moe")
    layer = types.SimpleNamespace(input_schemas={"w13": input_schema, "w2": input_schema},
                                  weight_schemas={"w13": weight_schema, "w2": weight_schema}, humming_configs=layers)
    quant_config = hmoe.get_humming_moe_quant_config(layer)
    return bool(experts.HummingExpertsBase._prequantizes_dispatch_activation(types.SimpleNamespace(
        quant_config=quant_config)))
