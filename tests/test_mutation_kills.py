"""Tests added for surviving mutants of the reader, the manifest schema and the expression evaluator
(issue 13, tools/mutation/): each one fails with a mutant that the older tests let through.

Fast and deterministic (no hypothesis): tools/mutation/run.sh runs this file for every mutant.
"""

from __future__ import annotations
