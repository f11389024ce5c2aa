"""Issue 25, must-show 1: `nojit build` on a small deployment shows nojit's plan line, then the progress bar,
then the summary, and nothing else; what vLLM, torch and the workers print is in the build log.

The terminal is the command's stdout and stderr merged into one pipe (so their order is the order a user sees).
Positive control: the same build with --verbose shows the third-party lines on the terminal.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import have

pytestmark = pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")

KERNEL = "MTPSharedHeadRMSNormKernel"
# every line nojit itself prints during a build: the log's path, planning, the plan, progress, the summary
OWN = re.compile(r"^(build log: |planning |plan: |compiling \[|bundle  |target  |built by |for  |entries  |kernel |"
                 r"vllm\.|-+ |-+$|build time: )")
# third-party output seen on this box (torch's glog lines, vLLM's logger and its missing _C, deprecations)
NOISE = re.compile(r"^[WIE]\d{4} |^(INFO|WARNING|DEBUG|ERROR) \d\d-\d\d |Failed to import from vllm\._C|deprecated")


def _build(tmp_path, name, kernels, *extra):
    cmd = [sys.executable, "-m", "nojit.aot.cli", "build", "--runtime", "triton", "--kernels", kernels, "-j", "2",
           "-o", str(tmp_path / f"{name}.nojit"), "--cache-dir", str(tmp_path / "cache"), *extra]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-4000:]
    return [line for line in p.stdout.splitlines() if line.strip()]


def _index(lines, prefix):
    return next(i for i, line in enumerate(lines) if line.startswith(prefix))


def test_quiet_build_shows_plan_progress_summary_only(tmp_path):
    lines = _build(tmp_path, "first", KERNEL)
    log = tmp_path / "first.build.log"
    assert lines[0].startswith(f"build log: {log}") and sum("build log:" in line for line in lines) == 1
    plan, bar, summary = _index(lines, "plan: "), _index(lines, "compiling ["), _index(lines, "bundle  ")
    assert plan < bar < summary < _index(lines, "build time: ")
    assert re.match(r"plan: 1 kernels \(triton\), \d+ keys \+ \d+ generic entries; 0 in the compile cache, "
                    r"\d+ to compile \(no estimate: no compile times recorded yet\)", lines[plan]), lines[plan]
    assert re.search(r" \d+/\d+ \d+(m\d\d)?s ETA \d+(m\d\d)?s ", lines[bar]), lines[bar]
    stray = [line for line in lines if not OWN.match(line)]
    assert stray == [], stray  # no third-party line on the terminal
    noise = [line for line in log.read_text().splitlines() if NOISE.search(line)]
    assert noise, "the build log holds none of the third-party lines this box prints"

    # a second build adds a kernel: the plan says what is cached and estimates the rest from recorded times
    again = _build(tmp_path, "second", f"{KERNEL},ComputePrefillMetadataKernel")
    line = again[_index(again, "plan: ")]
    assert re.search(r"2 kernels \(triton\).*; [1-9]\d* in the compile cache, [1-9]\d* to compile, about \d+(m\d\ds|s) "
                     r"on 2 jobs \(recorded compile times", line), line
    assert [x for x in again if not OWN.match(x)] == []

    # control: --verbose shows the libraries' output on the terminal, as before
    loud = _build(tmp_path, "loud", KERNEL, "--verbose")
    assert any(NOISE.search(x) for x in loud) and not any(x.startswith("build log:") for x in loud)
    assert not os.path.exists(tmp_path / "loud.build.log")
