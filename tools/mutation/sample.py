"""Pick which mutants of a cosmic-ray session run: a deterministic, documented sample.

cosmic-ray (8.7) makes every variant of every operator at every site: `a << b` alone gives 11
mutants, `<=` gives 7. On a 2-core box the full set (about 3,000 mutants over the reader, the
schema and the key rules) takes many hours, so this marks the others SKIPPED in the session, the
way cosmic-ray's own cr-filter-* tools do:

1. Mutants inside a type annotation are dropped as equivalent by construction: every module
   under test has `from __future__ import annotations`, so an annotation is never evaluated.
2. Per site (position + operator family, e.g. every `ReplaceComparisonOperator_LtE_*` at one
   `<=`), one variant is kept, chosen by sha256 of "module:operator:occurrence" (smallest wins).
3. Of the sites, those whose sha256 of "module:row:col:family" is 0 mod --every are kept
   (--every 1 keeps every site).

--only FILE (lines "operator occurrence", e.g. from report.py --survivors) keeps exactly those
mutants instead: the re-run of a module's survivors after new tests.

usage: python tools/mutation/sample.py SESSION.sqlite MODULE.py [--every N] [--only FILE]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

_FAMILY = re.compile(r"^(core/Replace(?:Binary|Comparison|Unary)Operator_[A-Za-z]+)_[A-Za-z]+$")


def family(operator: str) -> str:
    """The operator without its replacement: all variants of one site share it."""
    return _FAMILY.sub(r"\1", operator)


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (row 1-based, col 0-based, as cosmic-ray's positions) of every annotation."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            anns.append(node.returns)
        if isinstance(node, ast.arg) and node.annotation is not None:
            anns.append(node.annotation)
        if isinstance(node, ast.AnnAssign):
            anns.append(node.annotation)
        spans += [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in anns]
    return spans


def digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("session")
    ap.add_argument("module")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--only")
    args = ap.parse_args(argv)
    with open(args.module) as fh:
        spans = annotation_spans(fh.read())
    only = None
    if args.only:
        with open(args.only) as fh:
            only = {(op, int(occ)) for op, occ in (line.split() for line in fh if line.strip())}
    with use_db(args.session, WorkDB.Mode.open) as db:
        items = [(item, item.mutations[0]) for item in db.pending_work_items]
        keep: dict[tuple, tuple[int, str]] = {}
        skipped = {"annotation": 0, "variant": 0, "site": 0, "not listed": 0}
        for item, m in items:
            if only is not None:
                continue
            if any(s <= tuple(m.start_pos) < e for s, e in spans):
                skipped["annotation"] += 1
                continue
            site = (tuple(m.start_pos), family(m.operator_name))
            rank = digest(f"{args.module}:{m.operator_name}:{m.occurrence}")
            if site not in keep or rank < keep[site][0]:
                keep[site] = (rank, item.job_id)
        chosen = set()
        for (pos, fam), (_, job) in keep.items():
            if digest(f"{args.module}:{pos[0]}:{pos[1]}:{fam}") % args.every == 0:
                chosen.add(job)
        for item, m in items:
            if only is not None:
                if (m.operator_name, m.occurrence) in only:
                    chosen.add(item.job_id)
                else:
                    skipped["not listed"] += 1
        for item, m in items:
            if item.job_id in chosen:
                continue
            if only is None and not any(s <= tuple(m.start_pos) < e for s, e in spans):
                pos_site = (tuple(m.start_pos), family(m.operator_name))
                skipped["variant" if keep[pos_site][1] != item.job_id else "site"] += 1
            db.set_result(item.job_id, WorkResult(output="not sampled (tools/mutation/sample.py)",
                                                  worker_outcome=WorkerOutcome.SKIPPED))
    print(f"{args.module}: {len(items)} mutants, {len(chosen)} to run; skipped {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
