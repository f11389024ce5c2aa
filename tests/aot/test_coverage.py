"""`nojit coverage`: the terminal table and the HTML report agree, and the HTML renders in a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.support.common import needs_vllm, run_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.split("\n\n")[0].splitlines():
        cells = line.split()
        if cells and (":" in cells[0] or cells[0] == "TOTAL"):
            rows[cells[0]] = cells[-9:]
    return rows


@pytest.fixture(scope="module")
def report(small_build, tmp_path_factory):
    d = tmp_path_factory.mktemp("coverage")
    plan = json.load(open(small_build["plan"]))
    # One more reachable key than the bundle has exactly: a run-time unaligned pointer (served by the
    # kernel's generic entry) and one with another constexpr (served by nothing).
    base = next(r for r in plan["requests"] if "BuildC128A" in r["kernel"] and r["variant"] == "exact")
    unaligned = json.loads(json.dumps(base))
    unaligned["key"]["spec"][0][1] = ""
    unaligned["origin"] = "derived:test"
    other = json.loads(json.dumps(base))
    other["key"]["spec"][-1] = ["constexpr", ["int", 512]]
    other["origin"] = "derived:test"
    plan["requests"] += [unaligned, other]
    plan_path, html = d / "plan.json", d / "coverage.html"
    plan_path.write_text(json.dumps(plan))
    out = run_cli("coverage", small_build["bundle"], "--plan", str(plan_path), "--html", str(html)).stdout
    return {"table": out, "html": html, "dir": d}


@needs_vllm
def test_table_counts(report):
    rows = _table_rows(report["table"])
    c128a = rows["vllm.models.deepseek_v4.sparse_mla:BuildC128ATopkMetadataKernel.kernel"]
    # declared derived recorded reachable bundled generic via-generic missing percent
    # (two generic entries: one laid out like the exact key, one with no divisibility hints)
    assert c128a == ["1", "2", "0", "3", "1", "2", "1", "1", "66.7"]
    assert rows["TOTAL"][3] == "15" and rows["TOTAL"][7] == "1"
    assert "missing (reachable, not served by the bundle):" in report["table"] and '["int",512]' in report["table"]


@needs_vllm
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (the README's test command installs it)")
def test_html_renders_in_a_browser_with_the_same_numbers(report):
    dom = subprocess.run([CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={report['dir'] / 'profile'}", "--dump-dom",
                          f"file://{report['html']}"], capture_output=True, text=True, timeout=120).stdout
    assert "<table" in dom and "nojit coverage" in dom
    table = _table_rows(report["table"])
    for kernel, cells in table.items():
        if kernel == "TOTAL":
            row = re.search(r'<tr class="total">(.*?)</tr>', dom, re.S).group(1)
        else:
            row = re.search(rf'<tr class="\w+" data-kernel="{re.escape(kernel)}">(.*?)</tr>', dom, re.S).group(1)
        numbers = re.findall(r'data-col="\w+">([\d.]+)<', row)
        assert numbers == cells, kernel
    png = report["dir"] / "shot.png"
    subprocess.run([CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={report['dir'] / 'profile2'}", f"--screenshot={png}",
                    "--window-size=1400,900", f"file://{report['html']}"], capture_output=True, timeout=120)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
