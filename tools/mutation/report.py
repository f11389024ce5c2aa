"""Summarize a cosmic-ray session of tools/mutation/run.sh: counts, and every survivor with its diff.

usage: python tools/mutation/report.py SESSION.sqlite [--survivors FILE] [--diffs]
--survivors FILE writes "operator occurrence" per surviving mutant (run.sh TARGET FILE re-runs them).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections import Counter

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("session")
    ap.add_argument("--survivors")
    ap.add_argument("--diffs", action="store_true")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    counts: Counter[str] = Counter()
    survivors = []
    with use_db(args.session, WorkDB.Mode.open) as db:
        total = db.num_work_items
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                counts["skipped (not sampled)"] += 1
            elif result.worker_outcome != WorkerOutcome.NORMAL:
                counts[f"worker {result.worker_outcome.value}"] += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                counts["survived"] += 1
                survivors.append((item.mutations[0], result))
            else:
                counts[result.test_outcome.value] += 1
        pending = total - sum(counts.values())
    run = total - counts["skipped (not sampled)"]
    print(f"{args.session}: {total} mutants, {run} run ({pending} pending): "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for m, result in sorted(survivors, key=lambda s: (s[0].start_pos, s[0].operator_name)):
        print(f"  SURVIVED {m.module_path}:{m.start_pos[0]}:{m.start_pos[1]} {m.operator_name} #{m.occurrence}")
        if args.diffs:
            lines = [ln for ln in (result.diff or "").splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
            for ln in lines:
                print(f"      {ln}")
    if args.survivors:
        with open(args.survivors, "w") as fh:
            fh.writelines(f"{m.operator_name} {m.occurrence}\n" for m, _ in survivors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
