"""`nojit coverage`: how much of a deployment's reachable key set a bundle holds, per kernel.

The reachable set comes from the same planning code the build uses (vLLM's declarations,
nojit's call-site derivations, recorded keys), so the report and the bundle can never
disagree about what "declared" means. Output: a terminal table and a self-contained HTML
page (no scripts, no external resources) whose numbers carry data attributes for checks.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from nojit.aot.plan import Plan, PlanRequest
from nojit.loader.bundle.file import Bundle
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.triton_key import generic_spec, key_from_json, runtime_params


@dataclass
class KernelCoverage:
    kernel: str
    runtime: str
    declared: int = 0  # keys from vLLM's warmup declarations
    derived: int = 0  # keys nojit derives from call sites
    recorded: int = 0  # keys merged from NOJIT_MODE=record files
    reachable: int = 0
    bundled: int = 0  # reachable keys with an exact entry
    generic_entries: int = 0  # generic entries in the bundle
    via_generic: int = 0  # reachable keys without an exact entry that a generic entry serves
    missing_keys: list[str] = field(default_factory=list)  # reachable keys served by nothing

    @property
    def percent(self) -> float:
        return 100.0 * (self.bundled + self.via_generic) / self.reachable if self.reachable else 100.0


def _kind(origin: str) -> str:
    return origin.partition(":")[0]


def compute(plan: Plan, bundle: Bundle) -> list[KernelCoverage]:
    """Per kernel: the reachable keys of `plan` against the entries of `bundle`."""
    m = bundle.manifest
    exact: dict[str, set[str]] = defaultdict(set)
    generic: dict[str, set[tuple[Any, Any]]] = defaultdict(set)  # the generic groups (generic_spec, options) served
    generic_entries: dict[str, int] = defaultdict(int)
    for e in m.entries:
        text = canonical_json(e.key).decode()
        if e.variant == "exact":
            exact[e.kernel].add(text)
        else:
            spec, options = key_from_json(e.key)
            generic[e.kernel].add((generic_spec(spec, runtime_params(m.kernels[e.kernel].info, len(spec))), options))
            generic_entries[e.kernel] += 1
    rows: dict[str, KernelCoverage] = {}
    for kid in sorted(set(plan.kernels) | set(m.kernels)):
        runtime = plan.kernels[kid].runtime if kid in plan.kernels else m.kernels[kid].runtime
        rows[kid] = KernelCoverage(kid, runtime, generic_entries=generic_entries[kid])
    for r in plan.requests:
        if r.variant != "exact":
            continue
        row = rows[r.kernel]
        kind = _kind(r.origin)
        if kind == "registry":
            row.declared += 1
        elif kind == "recorded":
            row.recorded += 1
        else:
            row.derived += 1
        row.reachable += 1
        text = canonical_json(r.key).decode()
        if text in exact[r.kernel]:
            row.bundled += 1
        elif row.runtime == "triton" and _served_generically(r, plan, generic[r.kernel]):
            row.via_generic += 1
        else:
            row.missing_keys.append(text)
    return list(rows.values())


def _served_generically(request: PlanRequest, plan: Plan, generics: set[tuple[Any, Any]]) -> bool:
    spec, options = key_from_json(request.key)
    return (generic_spec(spec, runtime_params(plan.kernels[request.kernel].info, len(spec))), options) in generics


def totals(rows: list[KernelCoverage]) -> dict[str, Any]:
    t = {k: sum(getattr(r, k) for r in rows) for k in
         ("declared", "derived", "recorded", "reachable", "bundled", "generic_entries", "via_generic")}
    t["missing"] = sum(len(r.missing_keys) for r in rows)
    t["kernels"] = len(rows)
    t["percent"] = 100.0 * (t["bundled"] + t["via_generic"]) / t["reachable"] if t["reachable"] else 100.0
    return t


COLUMNS = ("kernel", "runtime", "declared", "derived", "recorded", "reachable", "bundled", "generic", "via generic",
           "missing", "covered %")


def _cells(r: KernelCoverage) -> list[str]:
    return [r.kernel, r.runtime, str(r.declared), str(r.derived), str(r.recorded), str(r.reachable), str(r.bundled),
            str(r.generic_entries), str(r.via_generic), str(len(r.missing_keys)), f"{r.percent:.1f}"]


def render_table(rows: list[KernelCoverage]) -> str:
    t = totals(rows)
    body = [_cells(r) for r in rows]
    body.append(["TOTAL", "", str(t["declared"]), str(t["derived"]), str(t["recorded"]), str(t["reachable"]),
                 str(t["bundled"]), str(t["generic_entries"]), str(t["via_generic"]), str(t["missing"]),
                 f"{t['percent']:.1f}"])
    widths = [max(len(row[i]) for row in [list(COLUMNS), *body]) for i in range(len(COLUMNS))]
    fmt = lambda row: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    lines = [fmt(list(COLUMNS)), fmt(["-" * w for w in widths]), *map(fmt, body)]
    missing = [(r.kernel, k) for r in rows for k in r.missing_keys]
    if missing:
        lines.append("")
        lines.append("missing (reachable, not served by the bundle):")
        lines.extend(f"  {kid}  {key}" for kid, key in missing)
    return "\n".join(lines)


def render_html(rows: list[KernelCoverage], bundle: Bundle, deployment: dict[str, Any]) -> str:
    t = totals(rows)
    esc = html.escape
    keys = ("declared", "derived", "recorded", "reachable", "bundled", "generic_entries", "via_generic")
    trs = []
    for r in rows:
        cells = "".join(f'<td class="num" data-col="{k}">{getattr(r, k)}</td>' for k in keys)
        cls = "ok" if not r.missing_keys else "bad"
        trs.append(f'<tr class="{cls}" data-kernel="{esc(r.kernel)}"><td class="kernel">{esc(r.kernel)}</td>'
                   f'<td>{r.runtime}</td>{cells}<td class="num" data-col="missing">{len(r.missing_keys)}</td>'
                   f'<td class="num" data-col="percent">{r.percent:.1f}</td></tr>')
    total_cells = "".join(f'<td class="num" data-col="{k}">{t[k]}</td>' for k in keys)
    missing = "".join(f"<li><code>{esc(r.kernel)}</code> <code>{esc(k)}</code></li>" for r in rows for k in r.missing_keys)
    p = bundle.manifest.producer
    data = json.dumps({"totals": t, "rows": [{**asdict(r), "percent": r.percent} for r in rows]}, sort_keys=True)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nojit coverage: {esc(deployment.get('name', ''))}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} th, td {{ padding: 3px 8px; border-bottom: 1px solid #ddd; }}
th {{ text-align: left; background: #f3f3f3; }} td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.kernel {{ font-family: monospace; font-size: 12px; word-break: break-all; max-width: 36em; }} tr.bad td {{ background: #fde8e8; }}
tr.total td {{ font-weight: bold; border-top: 2px solid #888; }} .summary {{ font-size: 18px; margin: 1em 0; }}
</style></head><body>
<h1>nojit coverage</h1>
<p>Bundle <code>{esc(bundle.path)}</code>, target {esc(bundle.manifest.target.arch)}, built with vLLM {esc(str(p.vllm))},
Triton {esc(str(p.triton))}, TileLang {esc(str(p.tilelang))}. Deployment <code>{esc(str(deployment.get('name')))}</code>.</p>
<p class="summary" id="summary" data-percent="{t['percent']:.1f}" data-reachable="{t['reachable']}"
 data-missing="{t['missing']}">{t['bundled'] + t['via_generic']} of {t['reachable']} reachable keys served
 ({t['percent']:.1f}%): {t['bundled']} exact, {t['via_generic']} by a generic entry; {t['missing']} missing;
 {t['generic_entries']} generic entries over {t['kernels']} kernels.</p>
<table id="coverage"><thead><tr><th>kernel</th><th>runtime</th><th>declared</th><th>derived</th><th>recorded</th>
<th>reachable</th><th>bundled</th><th>generic</th><th>via generic</th><th>missing</th><th>covered %</th></tr></thead>
<tbody>{''.join(trs)}<tr class="total"><td>TOTAL</td><td></td>{total_cells}<td class="num" data-col="missing">{t['missing']}</td>
<td class="num" data-col="percent">{t['percent']:.1f}</td></tr></tbody></table>
<h2>Missing keys</h2><ul id="missing">{missing or '<li>none</li>'}</ul>
<p>declared: vLLM's warmup declarations; derived: nojit's derivations from vLLM's call sites; recorded: keys
merged from NOJIT_MODE=record; generic: entries with no value specialization that serve any key of the
same constexprs and dtypes.</p>
<script type="application/json" id="coverage-data">{html.escape(data, quote=False)}</script>
</body></html>
"""
