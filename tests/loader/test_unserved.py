"""The process's JIT table (loader/unserved.py): one row per bundle runtime, and the startup report it gives."""

from __future__ import annotations

import pytest

from nojit.loader import unserved
from nojit.loader.bundle.manifest import RUNTIMES


def test_every_runtime_serves_exactly_one_listed_jit():
    assert sorted(j.runtime for j in unserved.jits()) == sorted(RUNTIMES)


def test_a_bundle_with_every_runtime_serves_every_reachable_jit():
    lines = unserved.report(frozenset(RUNTIMES))
    assert lines == [lines[0]] and "every JIT this process can reach is served" in lines[0], lines
    assert unserved.unserved(frozenset(RUNTIMES)) == []


def test_a_triton_only_bundle_names_each_reachable_jit_it_lacks(monkeypatch):
    monkeypatch.setattr(unserved, "_reachable", lambda jit: jit.runtime != "humming")  # Humming not installed here
    lines = unserved.report(frozenset({"triton"}))
    missing = {j.runtime for j in unserved.unserved(frozenset({"triton"}))}
    assert missing == {"tilelang", "deepgemm", "cutedsl", "flashinfer", "flashinfer_cute"}
    assert len(lines) == 1 + len(missing)
    deepgemm = next(line for line in lines if "DeepGEMM" in line)
    assert "no deepgemm entries" in deepgemm and "no switch:" in deepgemm and "--runtime deepgemm" in deepgemm
    assert not any("Humming" in line for line in lines)


@pytest.mark.parametrize("value, said", [("0", "switched off here"), ("1", "avoid with")])
def test_flashinfer_switches_are_read_from_the_environment(monkeypatch, value, said):
    monkeypatch.setattr(unserved, "_reachable", lambda jit: True)
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", value)
    line = next(line for line in unserved.report(frozenset({"triton"})) if "FlashInfer JIT" in line)
    assert said in line and "VLLM_USE_FLASHINFER_SAMPLER=0" in line.split(said)[1]


def test_flashinfer_cute_row_names_the_gdn_switch(monkeypatch):
    """FlashInfer's CuTeDSL GDN prefill is a runtime's row now (flashinfer_cute), with vLLM's switch away from it."""
    monkeypatch.setattr(unserved, "_reachable", lambda jit: True)
    line = next(line for line in unserved.report(frozenset({"triton"})) if "FlashInfer CuTeDSL cache" in line)
    assert "GDN prefill" in line and "--runtime flashinfer_cute" in line
    assert not any(j.name.startswith("FlashInfer CuTeDSL GDN") for j in unserved.MODEL_ONLY_JITS)
