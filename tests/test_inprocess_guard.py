"""Strict mode refuses the in-process compilers (loader/inprocess_guard.py, csrc/nojit_inproc.c), each written
as the attack: NVRTC through cuda.bindings (its Python wrapper, and the function taken before strict mode went
up, which reaches the C entry) and through ctypes (a copy loaded before strict mode and one loaded after), and
nvJitLink through ctypes and cuda.bindings, PTX to cubin. Positive control: with strict mode off each form
really produces an sm_90 cubin (its ELF header checked), and in the strict run the same compile works again
once strict mode is lifted in the same process. Each refusal leaves an event line. No GPU needed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "inprocess_compilers.py")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("cuda.bindings") is None,
    reason="needs the nvidia-cuda-nvrtc / nvidia-nvjitlink wheels and cuda-bindings (vLLM's torch brings them)")

FORMS = {  # form -> what the strict-mode refusal names in the event line
    "nvrtc-bindings": "cuda.bindings.nvrtc.nvrtcCompileProgram",
    "nvrtc-bindings-captured": "nvrtcCompileProgram",
    "nvrtc-ctypes": "nvrtcCompileProgram",
    "nvrtc-ctypes-later": "nvrtcCompileProgram",
    "nvjitlink-ctypes": "nvJitLinkAddData",
    "nvjitlink-bindings": "cuda.bindings.nvjitlink.add_data",
}


def _run(form: str, mode: str, tmp_path) -> tuple[dict, list[dict]]:
    log = tmp_path / f"{form}-{mode}.jsonl"
    env = {**os.environ, "NOJIT_EVENT_LOG": str(log)}
    env.pop("CUDA_DISABLE_PTX_JIT", None)
    proc = subprocess.run([sys.executable, PROBE, form, mode], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return json.loads(proc.stdout.strip().splitlines()[-1]), events


@pytest.mark.parametrize("form", sorted(FORMS))
def test_in_process_compile_refused_in_strict_mode(form, tmp_path):
    control, events = _run(form, "off", tmp_path)
    assert control["result"]["sm"] == 90, control  # positive control: the form really compiles to sm_90 SASS
    assert not [e for e in events if e["event"] == "compile_forbidden"]

    strict, events = _run(form, "strict", tmp_path)
    result = strict["result"]
    assert result["size"] == 0 and result["sm"] is None, strict  # nothing compiled
    if "bindings" in FORMS[form]:
        assert "strict mode" in result["forbidden"] and FORMS[form] in result["forbidden"]  # CompileForbiddenError
    else:
        assert result["rc"] in (3, 6), strict  # the library's own error: NVJITLINK_ERROR_INVALID_INPUT, NVRTC_ERROR_COMPILATION
        assert strict["c_refusals"] >= 1
    refused = [e for e in events if e["event"] == "compile_forbidden"]
    assert len(refused) == 1 and FORMS[form] in refused[0]["what"] and refused[0]["via"] == "in-process", events
    assert strict["ptx_jit_env"] == "1" and strict["env_after"] is None  # forced in strict mode, restored after
    assert strict["after_uninstall"]["sm"] == 90, strict  # lifted in the same process: compiles again


def test_importable_compilers_reported_never_imported(tmp_path):
    """A compiler package that could be imported is named in the report and an event line, without importing it."""
    fake = tmp_path / "site" / "cupy"
    fake.mkdir(parents=True)
    marker = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    log = tmp_path / "events.jsonl"
    code = ("from nojit.loader import guards, inprocess_guard; guards.install_strict_guards(); "
            "r = inprocess_guard.report(); print(r.summary()); print(','.join(r.importable))")
    env = {**os.environ, "NOJIT_EVENT_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary, importable = proc.stdout.strip().splitlines()[-2:]
    assert "cupy" in importable.split(",") and "importable, not refused: " in summary and "cupy" in summary
    assert "driver PTX JIT off" in summary
    assert not marker.exists()  # found with find_spec, never imported
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e for e in events if e["event"] == "inprocess_compiler_importable" and "cupy" in e["modules"]]
