"""Generated binder/run code is compiled once per distinct source text, and each function keeps its own name
for tracebacks (loader/triton_key.generated, issue 15)."""

from __future__ import annotations

import builtins

from nojit.loader.bundle import triton_key
from nojit.loader.bundle.triton_key import generated


def test_one_compile_per_source_text_each_function_keeps_its_filename(monkeypatch):
    src = "def bind(a, b=_nj_default_1, **_nj_options):\n    return (a, b), _nj_options\n#s6-c2 test\n"
    triton_key._GENERATED.pop(src, None)
    calls = []
    real = builtins.compile
    monkeypatch.setattr(builtins, "compile", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    first = generated(src, "<nojit binder m:first>", {"_nj_default_1": 1}, "bind")
    second = generated(src, "<nojit binder m:second>", {"_nj_default_1": 2}, "bind")
    assert calls == ["<nojit binder m:first>"]
    assert first.__code__.co_filename == "<nojit binder m:first>"
    assert second.__code__.co_filename == "<nojit binder m:second>"
    assert first(5) == ((5, 1), {}) and second(5, x=3) == ((5, 2), {"x": 3})  # each over its own namespace
