"""The Qwen3.5 / Qwen3-Next room's facts without a build: model lookup by model_type or text_config, the
deployment rules, the GDN cache facts and KV-cache groups vLLM would build, and the Inductor check."""

from __future__ import annotations

import dataclasses  # noqa: F401
import subprocess
import sys

import pytest

from tests.support.common import have

pytestmark = pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")
QWEN = "builtin:qwen3.5-35b-a3b-fp8-h200.toml"


def test_lookup_by_model_type_or_text_config():
    from nojit.aot.deployment import load_deployment
    from nojit.aot.errors import BuildError
    from nojit.aot.models import model_for, qwen3_5

    hf = load_deployment(QWEN).hf_config
    assert hf["model_type"] == "qwen3_5_moe" and hf["text_config"]["model_type"] == "qwen3_5_moe_text"
    assert model_for(hf, "x").tables is qwen3_5.MODELS[0].tables
    nested_only = {"model_type": "some_wrapper", "text_config": {"model_type": "qwen3_next"}}
    assert model_for(nested_only, "x").name == "qwen3_5"  # Qwen3-Next and Qwen3.5 dense share the rows
    assert model_for({"model_type": "qwen3_5_text"}, "x").name == "qwen3_5"
    with pytest.raises(BuildError, match=r"model_type is 'llama' \(text_config: None\)"):
        model_for({"model_type": "llama"}, "x")


def test_gdn_cache_facts_and_groups_as_vllm_builds_them():
    """Block 1088: the smallest multiple of lcm(16, 64) whose attention page (2 KV heads x 256 x 2 bytes x 2 per
    token) covers the GDN page (conv 4 x 8192 bf16 + state 32 x 128 x 128 fp32 = 2162688 bytes, MTP 1). In a
    process of its own: the deployment rules install the deployment's platform, which stays for the process (one
    build process, one platform: aot/vllm_env.py), and would leak into later tests of this one."""
    body = f"""
import dataclasses, pytest
from nojit.aot.deployment import load_deployment
from nojit.aot.errors import BuildError
from nojit.aot.models import model_for
from nojit.aot.models.qwen3_5.config import gdn_facts, kv_cache_groups

d = load_deployment({QWEN!r})
model = model_for(d.hf_config, d.hf_config_source)
model.check_deployment(d)
f = gdn_facts(d)
assert (f.h, f.hv, f.k, f.v, f.conv_state_len, f.conv_dim) == (16, 32, 128, 128, 4, 8192), f
assert 4 * 8192 * 2 + 32 * 128 * 128 * 4 == 2162688 <= f.page_bytes == 1088 * 2048, f
assert f.block_size == 1088 and (1088 - 64) * 2048 < 2162688, f
groups = kv_cache_groups(d)  # 10 full-attention layers + 1 MTP layer; 30 GDN layers in groups of 11
assert [g.mamba for g in groups] == [False, True, True, True], groups
assert all(g.block_size == 1088 for g in groups) and groups[1].speculative_blocks == 1, groups
with pytest.raises(BuildError, match=r"block_size = 256: vLLM aligns .* to 1088"):
    model.check_deployment(dataclasses.replace(d, block_size=256))
with pytest.raises(BuildError, match=r"method = 'eagle'"):
    model.check_deployment(dataclasses.replace(d, speculative_method="eagle"))
print("GDN FACTS OK")
"""
    p = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "GDN FACTS OK" in p.stdout, p.stderr[-3000:]


def test_gdn_prefill_backend_as_vllm_resolves_it_and_the_block_it_makes():
    """The setting is vLLM's --gdn-prefill-backend, resolved by vLLM's own _resolve_gdn_prefill_backend on the
    stand-in H200: unset (the default deployment) is FlashInfer's; triton drops FlashInfer's 64-token checkpoint
    alignment, so the block is 1056 (1056 x 2048 bytes = the GDN page exactly), and the built-in triton deployment
    says so; values vLLM refuses or the rows do not know are field errors."""
    body = f"""
import dataclasses, pytest
from nojit.aot.deployment import load_deployment
from nojit.aot.errors import BuildError
from nojit.aot.models import model_for
from nojit.aot.models.qwen3_5.config import gdn_facts, gdn_prefill_backend

d = load_deployment({QWEN!r})
t = load_deployment("builtin:qwen3.5-35b-a3b-fp8-h200-gdn-triton.toml")
model = model_for(d.hf_config, d.hf_config_source)
model.check_deployment(d)
model.check_deployment(t)
assert d.gdn_prefill_backend is None and gdn_prefill_backend(d) == "flashinfer" and gdn_facts(d).block_size == 1088
assert t.gdn_prefill_backend == "triton" and gdn_prefill_backend(t) == "triton" and gdn_facts(t).block_size == 1056
assert 1056 * 2048 == 2162688
assert gdn_prefill_backend(dataclasses.replace(d, gdn_prefill_backend="cutedsl")) == "triton"  # vLLM's sm_90 fallback
with pytest.raises(BuildError, match=r"block_size = 1088: vLLM aligns .* to 1056"):
    model.check_deployment(dataclasses.replace(t, block_size=1088))
with pytest.raises(BuildError, match=r"\[serving\] gdn_prefill_backend = 'sycl': vLLM says: .*only supported on XPU"):
    model.check_deployment(dataclasses.replace(d, gdn_prefill_backend="sycl"))
with pytest.raises(BuildError, match=r"gdn_prefill_backend = 'aiter_flydsl': vLLM says: .*ROCm AITER backend"):
    model.check_deployment(dataclasses.replace(d, gdn_prefill_backend="aiter_flydsl"))
with pytest.raises(BuildError, match=r"gdn_prefill_backend = 'fla': vLLM's --gdn-prefill-backend takes one of"):
    model.check_deployment(dataclasses.replace(d, gdn_prefill_backend="fla"))
assert "gdn_prefill_backend" not in d.as_dict() and t.as_dict()["gdn_prefill_backend"] == "triton"
print("BACKEND OK")
"""
    p = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "BACKEND OK" in p.stdout, p.stderr[-3000:]


def test_inductor_check_reads_vllms_compilation_config():
    from types import SimpleNamespace

    from vllm.config.compilation import CompilationConfig, CompilationMode

    from nojit.loader import inductor
    from nojit.loader.errors import PreflightError

    def config(**kw):
        return SimpleNamespace(compilation_config=CompilationConfig(**kw),
                               model_config=SimpleNamespace(architectures=["Qwen3_5MoeForConditionalGeneration"]))

    assert inductor.would_compile(config(mode=CompilationMode.NONE)) is None
    assert inductor.would_compile(config(mode=CompilationMode.VLLM_COMPILE, backend="eager")) is None
    assert inductor.would_compile(SimpleNamespace()) is None  # a partial config says nothing
    with pytest.raises(PreflightError) as e:
        inductor.check(config(mode=CompilationMode.VLLM_COMPILE))
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH=1" in str(e.value) and "Qwen3_5MoeForConditionalGeneration" in str(e.value)
