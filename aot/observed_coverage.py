"""`nojit coverage --observed FILE`: the keys real steps reached, beside the keys the plan declared.

FILE is JSONL in NOJIT_MODE=record's format (one {"kernel", "runtime", "key", "outcome"} per line),
written by a recording run or by tests/gpu/checks/check_call_sites.py. Per kernel: how many distinct keys
were observed, how many of them the plan has (a reached key the plan lacks is an enumerator defect),
and how the bundle serves them: an exact entry, a generic entry, or nothing. So "100%" can be checked
against what a workload actually launched, not only against the plan the bundle was built from.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.bundle.file import Bundle
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.triton_key import generic_spec, key_from_json, runtime_params


@dataclass
class ObservedRow:
    kernel: str
    observed: int = 0
    planned: int = 0  # observed keys the plan has
    exact: int = 0  # observed keys with an exact entry
    generic: int = 0  # observed keys served only by a generic entry
    missing: list[str] = field(default_factory=list)  # observed keys nothing in the bundle serves
    unplanned: list[str] = field(default_factory=list)  # observed keys the plan lacks


def read_observed(path: str) -> dict[str, set[str]]:
    """kernel id -> canonical JSON of each distinct observed key (lines without a key are skipped)."""
    out: dict[str, set[str]] = defaultdict(set)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc}); expected NOJIT_MODE=record's format") from None
            if rec.get("key") is not None:
                out[rec["kernel"]].add(canonical_json(rec["key"]).decode())
    return out


def compute(observed: dict[str, set[str]], plan: Any, bundle: Bundle) -> list[ObservedRow]:
    m = bundle.manifest
    planned: dict[str, set[str]] = defaultdict(set)
    for r in plan.requests:
        if r.variant == "exact":
            planned[r.kernel].add(canonical_json(r.key).decode())
    exact: dict[str, set[str]] = defaultdict(set)
    generic: dict[str, set[Any]] = defaultdict(set)
    for e in m.entries:
        if e.variant == "exact":
            exact[e.kernel].add(canonical_json(e.key).decode())
        elif m.kernels[e.kernel].runtime == "triton":
            spec, options = key_from_json(e.key)
            generic[e.kernel].add((generic_spec(spec, runtime_params(m.kernels[e.kernel].info, len(spec))), options))
    rows = []
    for kid in sorted(observed):
        row = ObservedRow(kid, observed=len(observed[kid]))
        for text in sorted(observed[kid]):
            row.planned += text in planned[kid]
            if text not in planned[kid]:
                row.unplanned.append(text)
            if text in exact[kid]:
                row.exact += 1
            elif kid in m.kernels and m.kernels[kid].runtime == "triton" and _generic_serves(text, kid, m, generic):
                row.generic += 1
            else:
                row.missing.append(text)
        rows.append(row)
    return rows


def _generic_serves(text: str, kid: str, manifest: Any, generic: dict[str, set[Any]]) -> bool:
    spec, options = key_from_json(json.loads(text))
    return (generic_spec(spec, runtime_params(manifest.kernels[kid].info, len(spec))), options) in generic[kid]


def render(rows: list[ObservedRow]) -> str:
    cols = ("kernel", "observed", "planned", "reached & exact", "reached & generic", "reached & missing")
    body = [[r.kernel, str(r.observed), str(r.planned), str(r.exact), str(r.generic), str(len(r.missing))]
            for r in rows]
    body.append(["TOTAL", *(str(sum(int(b[i]) for b in body)) for i in range(1, len(cols)))])
    widths = [max(len(row[i]) for row in [list(cols), *body]) for i in range(len(cols))]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    lines = ["", "observed keys (reached on real steps) against the plan and the bundle:",
             fmt(list(cols)), fmt(["-" * w for w in widths]), *map(fmt, body)]
    for label, attr in (("reached, not planned (an enumerator defect)", "unplanned"),
                        ("reached, not served by the bundle", "missing")):
        items = [(r.kernel, k) for r in rows for k in getattr(r, attr)]
        if items:
            lines += ["", f"{label}:", *(f"  {kid}  {key}" for kid, key in items)]
    return "\n".join(lines)


def report(path: str, plan: Any, bundle: Bundle) -> tuple[str, bool]:
    """The rendered table, and whether every observed key was planned and served."""
    rows = compute(read_observed(path), plan, bundle)
    return render(rows), all(not r.missing and not r.unplanned for r in rows)
