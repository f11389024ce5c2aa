"""Human-readable summaries of a bundle (for `nojit build`, `nojit inspect`)."""

from __future__ import annotations

import os
from collections import defaultdict

from nojit.loader.bundle.file import Bundle
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.manifest import Manifest


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def versions_line(m: Manifest) -> str:
    p = m.producer
    parts = [f"nojit {p.nojit}", f"vllm {p.vllm}", f"triton {p.triton}", f"tilelang {p.tilelang}",
             f"ptxas {p.ptxas}", f"nvcc {p.nvcc}", f"python {p.python}", f"torch {p.torch}"]
    return ", ".join(parts)


def summary(bundle: Bundle, keys: bool = False) -> str:
    m = bundle.manifest
    per_kernel: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in m.entries:
        d = per_kernel[e.kernel]
        d[e.variant] += 1
        d["bytes"] += m.blobs[e.blob].size
    rows = []
    for kid in sorted(m.kernels):
        rec = m.kernels[kid]
        d = per_kernel[kid]
        rows.append([kid, rec.runtime, str(d["exact"]), str(d["generic"]), f"{d['bytes'] / 1024:.0f}", rec.source_hash[:12]])
    raw = sum(b.size for b in m.blobs.values())
    out = [
        f"bundle   {bundle.path} ({os.path.getsize(bundle.path) / 1024:.0f} KiB on disk, {raw / 1024:.0f} KiB of cubins "
        f"in {len(m.blobs)} distinct blobs)",
        f"target   {m.target.arch} (compute capability {m.target.capability})",
        f"built by {versions_line(m)}",
        f"for      {m.deployment.get('name', '?')}",
        f"entries  {len(m.entries)} ({sum(1 for e in m.entries if e.variant == 'exact')} exact, "
        f"{sum(1 for e in m.entries if e.variant == 'generic')} generic) over {len(m.kernels)} kernels",
        "",
        _table(rows, ["kernel", "runtime", "exact", "generic", "KiB", "source"]),
    ]
    tuned = [(kid, m.kernels[kid].autotune) for kid in sorted(m.kernels) if m.kernels[kid].autotune is not None]
    if tuned:
        out.append("")
        out.append("autotuned (Triton's Autotuner chooses among these configs; a winner is served with no benchmark):")
        for kid, at in tuned:
            out.append(f"  {kid}: {len(at.configs)} configs, {len(at.keys)} tuning keys, {at.tuned} with a winner")
            if keys:
                for k in at.keys:
                    won = f"winner {at.configs[k.winner]}" if k.winner is not None else "no winner"
                    out.append(f"    {k.text()}: configs {list(k.configs)}, {won}")
    if keys:
        out.append("")
        out.append("keys:")
        for e in sorted(m.entries, key=lambda e: (e.kernel, e.variant)):
            out.append(f"  {e.kernel} [{e.variant}, {e.origin}] {canonical_json(e.key).decode()}  "
                       f"{m.blobs[e.blob].size} B {e.blob[:12]}")
    return "\n".join(out)
