"""`nojit build` and `nojit inspect` on real vLLM kernels: content, reproducibility, error output."""

from __future__ import annotations

import json

from tests.support.common import SMALL_KERNELS, needs_vllm, run_cli
from nojit.loader.bundle.file import Bundle
from nojit.loader.bundle.triton_key import key_from_json


@needs_vllm
def test_small_bundle_content(small_build):
    b = Bundle.open(small_build["bundle"])
    m = b.manifest
    assert m.producer.vllm == "0.33.0" and m.producer.triton == "3.8.0" and m.producer.ptxas
    assert m.target.arch == "sm_90a" and m.deployment["name"] == "deepseek-v4-flash-h200-tp4-mtp1"
    assert {k.rpartition(":")[2] for k in m.kernels} == {
        "BuildC128ATopkMetadataKernel.kernel", "MTPSharedHeadRMSNormKernel.kernel", "ComputePrefillMetadataKernel.kernel"}
    exact = [e for e in m.entries if e.variant == "exact"]
    assert len(exact) == 13  # 1 + 1 + 11 (BLOCK_SIZE 1..1024), vLLM's own declaration
    for e in m.entries:
        assert e.launch.symbol == "kernel" and e.launch.args and e.launch.compile_hash
        key_from_json(e.key)
        assert b.read_blob(e.blob)[:4] == b"\x7fELF"
    assert {e.origin for e in exact} <= {f"registry:{m.kernels[e.kernel].info['owner']}" for e in exact}
    assert all(e.origin == "fallback" for e in m.entries if e.variant == "generic")


@needs_vllm
def test_rebuild_is_byte_identical(small_build, tmp_path):
    again = str(tmp_path / "again.nojit")
    run_cli("build", "--runtime", "triton", "--kernels", SMALL_KERNELS, "-o", again, "--cache-dir", str(tmp_path / "fresh"),
            "--quiet", "-j", "1")
    assert open(again, "rb").read() == open(small_build["bundle"], "rb").read()


@needs_vllm
def test_inspect_prints_kernels_keys_and_versions(small_build):
    out = run_cli("inspect", small_build["bundle"], "--keys", "--verify").stdout
    assert "verified" in out and "sm_90a" in out and "triton 3.8.0" in out and "vllm 0.33.0" in out
    assert "ComputePrefillMetadataKernel.kernel" in out and "[exact, registry:" in out
    manifest = json.loads(run_cli("inspect", small_build["bundle"], "--json").stdout)
    from nojit.loader.bundle.manifest import FORMAT_VERSION

    assert manifest["format"] == FORMAT_VERSION == 2


def test_inspect_of_a_damaged_file_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.nojit"
    bad.write_bytes(b"NOJITBN1" + b"\x01" * 100)
    p = run_cli("inspect", str(bad), check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith(f"nojit: error: {bad}") and "fix:" in p.stderr


def test_deepseek_v4_rules_are_its_model_rooms_not_the_deployment_files(tmp_path):
    """block_size 256, mtp only and fp8 KV are DeepSeek-V4's (aot/models/deepseek_v4/deployment_rules.py): the
    deployment file loads with other values, the model room refuses each naming the field, and a model with no
    rules of its own accepts the same deployment."""
    import dataclasses

    import pytest

    from nojit.aot.deployment import default_deployment_text, load_deployment
    from nojit.aot.errors import BuildError
    from nojit.aot.faces import Model
    from nojit.aot.models import model_for

    dep = tmp_path / "d.toml"
    dep.write_text(default_deployment_text().replace("block_size = 256", "block_size = 64"))
    d = load_deployment(str(dep))  # the file's own rules hold
    model = model_for(d.hf_config, d.hf_config_source)
    with pytest.raises(BuildError, match=r"\[serving\] block_size = 64: .*accept only 256"):
        model.check_deployment(d)
    ok = dataclasses.replace(d, block_size=256)
    model.check_deployment(ok)
    for change, field in ((dict(speculative_method="eagle"), r"\[speculative\] method = 'eagle'"),
                          (dict(kv_cache_dtype="bfloat16"), r"\[serving\] kv_cache_dtype = 'bfloat16'")):
        with pytest.raises(BuildError, match=field):
            model.check_deployment(dataclasses.replace(ok, **change))
    Model(name="other", model_type="other", tables={}).check_deployment(d)  # no rules: nothing refused


def test_bad_deployment_file_names_the_field(tmp_path):
    dep = tmp_path / "d.toml"
    dep.write_text(run_cli("build", "--print-default-deployment").stdout.replace("block_size = 256", "block_size = 64"))
    p = run_cli("build", "--deployment", str(dep), "-o", str(tmp_path / "x.nojit"), check=False)
    assert p.returncode == 2 and "[serving] block_size = 64" in p.stderr and "accept only 256" in p.stderr
    assert not (tmp_path / "x.nojit").exists()
    dep.write_text("name = [unclosed")
    p = run_cli("build", "--deployment", str(dep), check=False)
    assert p.returncode == 2 and "is not valid TOML" in p.stderr


def test_default_runtimes_are_every_registered_runtime():
    """`nojit build` with no --runtime plans every runtime nojit registers: a Qwen3.5 bundle built with the default
    command holds FlashInfer's GDN prefill keys (flashinfer_cute), which the CLI's old default list left out, so a
    strict server refused its first prefill. --help names each of them."""
    import argparse

    from nojit.aot import cli
    from nojit.aot.runtimes import RUNTIMES

    assert cli._runtimes(argparse.Namespace(runtime=None)) == frozenset(RUNTIMES)
    assert "flashinfer_cute" in RUNTIMES
    assert cli._runtimes(argparse.Namespace(runtime="triton, deepgemm")) == {"triton", "deepgemm"}
    text = run_cli("build", "--help").stdout
    assert all(name in text for name in RUNTIMES), text
    for bad, said in (("triton,flashinfer-cute", "unknown runtime 'flashinfer-cute'"), ("", "names no runtime")):
        p = run_cli("build", "--runtime", bad, "--plan-only", "--emit-plan", "/dev/null", check=False)
        assert p.returncode == 2 and said in p.stderr and "fix:" in p.stderr and "Traceback" not in p.stderr, p.stderr
