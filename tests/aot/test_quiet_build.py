"""Issue 25, must-show 1: `nojit build` on a small deployment shows nojit's plan line, then the progress bar,
then the summary, and nothing else; what vLLM, torch and the workers print is in the build log.

The terminal is the command's stdout and stderr merged into one pipe (so their order is the order a user sees).
Control: the log holds the third-party lines this box prints (vLLM's missing `_C`, torch's deprecations), so
there was noise to divert. One build only (about 10 minutes on the loaded 2-core box, mostly vLLM's import
in the planner and in the worker); the estimate a later build prints is computed from the times it recorded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.support.common import have

pytestmark = pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")

KERNEL = "MTPSharedHeadRMSNormKernel"
# every line nojit itself prints during a build: the log's path, planning, the plan, progress, the summary
OWN = re.compile(r"^(build log: |planning |plan: |compiling \[|bundle  |target  |built by |for  |entries  |kernel |"
                 r"vllm\.|-+ |-+$|build time: )")
# third-party output seen on this box (torch's glog lines, vLLM's logger and its missing _C, deprecations)
NOISE = re.compile(r"^[WIE]\d{4} |^(INFO|WARNING|DEBUG|ERROR) \d\d-\d\d |Failed to import from vllm\._C|deprecated")


def test_quiet_build_shows_plan_progress_summary_only(tmp_path):
    out, plan_file, cache = tmp_path / "small.nojit", tmp_path / "small.plan.json", tmp_path / "cache"
    cmd = [sys.executable, "-m", "nojit.aot.cli", "build", "--runtime", "triton", "--kernels", KERNEL, "-j", "1",
           "-o", str(out), "--cache-dir", str(cache), "--emit-plan", str(plan_file)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-4000:]
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    log = tmp_path / "small.build.log"

    def first(prefix):
        return next(i for i, line in enumerate(lines) if line.startswith(prefix))

    assert lines[0].startswith(f"build log: {log}") and sum("build log:" in line for line in lines) == 1
    plan, bar, summary = first("plan: "), first("compiling ["), first("bundle  ")
    assert plan < bar < summary < first("build time: ")
    assert re.match(r"plan: 1 kernels \(triton\), 1 keys \+ \d+ generic entries; 0 of \d+ in the compile cache, "
                    r"\d+ to compile \(no estimate: no compile times recorded yet\)", lines[plan]), lines[plan]
    assert re.search(r" \d+/\d+ \d+(m\d\d)?s ETA \d+(m\d\d)?s ", lines[bar]), lines[bar]
    stray = [line for line in lines if not OWN.match(line)]
    assert stray == [], stray  # no third-party line on the terminal
    noise = [line for line in log.read_text().splitlines() if NOISE.search(line)]
    assert any("vllm._C" in line for line in noise) and any("deprecated" in line for line in noise), noise[:5]

    # the build recorded its compile times beside the cache; the next plan estimates from them
    from nojit.aot.build import plan_line
    from nojit.aot.compile_times import CompileTimes
    from nojit.aot.plan import Plan

    times = CompileTimes(str(cache / "compiled"))
    (kernel_id,) = [k for k in times.kernels if KERNEL in k]
    runtime, count, seconds = times.kernels[kernel_id]
    assert runtime == "triton" and count == len(Plan.read(str(plan_file)).requests) and seconds > 0
    assert json.loads((cache / "compiled" / "compile-times.json").read_text()) == times.kernels
    again = Plan.read(str(plan_file))
    line = plan_line(again, 0, list(range(len(again.requests))), times, 1)
    assert re.search(r", about \d+(m\d\d)?s on 1 job \(recorded compile times\)$", line), line
