"""A runtime added from a test-only folder (tests/toy_runtime/: one room per side, one registration line
each, no package file touched) is planned, built, installed, preloaded, announced, listed in the unserved-JIT
table and served through the dry launcher; leaving the registrations' scope forgets it on both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = os.path.join(ROOT, "tests", "toy_runtime", "scenario.py")


def test_a_toy_runtime_from_outside_the_package_goes_the_whole_way(tmp_path):
    out = subprocess.run([sys.executable, SCENARIO, str(tmp_path / "toy.nojit")], capture_output=True, text=True,
                         timeout=900, env={**os.environ, "NOJIT_QUIET": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["planned"] == ['{"n": 128}', '{"n": 64}']
    assert r["built_entries"] == [{"symbol": "scale_128", "grid": 4}, {"symbol": "scale_64", "grid": 2}]
    assert r["handles"] == ["toy"]
    assert r["preloaded"] == 2 and r["loads_after_preload"] == 2  # both blobs loaded (digest-checked) at preload
    assert r["launches"] == [[4, 1, 1]]  # scale(128) launched its entry's grid through the launcher
    assert r["miss"] == "KernelNotInBundleError"  # n=96 is not in the bundle: refused, not compiled
    assert "1 Toy kernels, 2 entries; mode strict" in r["announced"][0]
    assert not any("Toy JIT" in line for line in r["announced"][1:])  # served: not in the unserved block
    assert any(line.startswith("  - Toy JIT (the toy kernels): no toy entries") and "--runtime toy" in line
               for line in r["unserved_without_toy"])
    assert "Toy JIT" in r["served_names"][0]
    assert r["after_uninstall"] == "toy JIT: would compile scale for n=128"  # its own run back
    assert r["registered_after"] == [False, False]
