"""Launch-geometry expressions stored as data, and their small, safe evaluator.

A TileLang kernel's grid depends on run-time sizes (`num_tokens`, `split_k`). The bundle
stores such an expression as a JSON tree, never as source text:

    7                                   an integer literal
    {"var": "num_tokens"}               a dynamic variable
    {"op": "+", "args": [e1, e2]}       + - * // % min max (floor division and modulo as in C
                                        for the non-negative values launch sizes take)
    {"op": "select", "args": [c, a, b]} c != 0 ? a : b

Evaluation is a walk over that tree with integer arithmetic only: no eval, no attribute
access, bounded depth and size (at most 256 nodes, so a launch pays a bounded cost), and every result must be a non-negative 32-bit integer.
At launch a result outside that range, a division by zero, and a grid or block beyond CUDA's limits
(`check_geometry`: the numbers csrc/nojit_fast_tilelang.h declines past too) are a LaunchError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nojit.loader.errors import LaunchError

_BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "min": min,
    "max": max,
    "<": lambda a, b: int(a < b),
    "<=": lambda a, b: int(a <= b),
    "==": lambda a, b: int(a == b),
}
# CUDA's launch limits (compute capability 9.0, the CUDA C programming guide's table of technical specifications):
# grid x up to 2^31 - 1, y and z up to 65535; block x and y up to 1024, z up to 64, at most 1024 threads.
GRID_LIMITS = ((1 << 31) - 1, 65535, 65535)
BLOCK_LIMITS = (1024, 1024, 64)
MAX_BLOCK_THREADS = 1024
_FIX = ("the grid and block come from the bundle's launch plan and this call's tensor shapes: check the shapes "
        "passed, or rebuild the bundle with `nojit build` if its plan is wrong")
_MAX_DEPTH = 32
_MAX_NODES = 256  # a grid or block expression is evaluated per launch: its cost is bounded


def validate_expr(expr: Any, variables: set[str] | frozenset[str], depth: int = 0) -> None:
    """Raise ValueError unless expr is a well-formed expression over `variables`, of bounded size."""
    if _validate(expr, variables, depth) > _MAX_NODES:
        raise ValueError(f"expression has more than {_MAX_NODES} nodes")


def _validate(expr: Any, variables: set[str] | frozenset[str], depth: int) -> int:
    """Checks one node and its children; returns how many nodes it holds (the cost of evaluating it)."""
    if depth > _MAX_DEPTH:
        raise ValueError("expression nested too deeply")
    if isinstance(expr, bool):
        raise ValueError("boolean literal in an integer expression")
    if isinstance(expr, int):
        if not -(1 << 62) <= expr <= (1 << 62):
            raise ValueError(f"literal {expr} out of range")
        return 1
    if not isinstance(expr, dict):
        raise ValueError(f"{type(expr).__name__} is not an expression")
    if set(expr) == {"var"}:
        name = expr["var"]
        if not isinstance(name, str) or name not in variables:
            raise ValueError(f"unknown variable {name!r:.80}")
        return 1
    if set(expr) != {"op", "args"} or not isinstance(expr["args"], list):
        raise ValueError(f"malformed expression node {sorted(expr)!r:.80}")
    op, args = expr["op"], expr["args"]
    if not isinstance(op, str) or (op != "select" and op not in _BINARY):
        raise ValueError(f"unknown operator {op!r:.40}")
    arity = 3 if op == "select" else 2
    if len(args) != arity:
        raise ValueError(f"operator {op} takes {arity} arguments, not {len(args)}")
    nodes = 1
    for a in args:
        nodes += _validate(a, variables, depth + 1)
        if nodes > _MAX_NODES:
            raise ValueError(f"expression has more than {_MAX_NODES} nodes")
    return nodes


def evaluate(expr: Any, values: Mapping[str, int]) -> int:
    """Value of a validated expression; LaunchError unless it is in [0, 2^32) (and for a division by zero)."""
    result = _eval(expr, values)
    if not 0 <= result < (1 << 32):
        raise LaunchError(f"launch dimension {result} is outside [0, 2^32)", fix=_FIX)
    return result


def check_geometry(grid: Sequence[int], block: Sequence[int] | None, what: str) -> None:
    """LaunchError unless grid (and block, where given) are within CUDA's limits; a grid axis may be 0 (nothing
    is launched), a block axis may not."""
    for axis, value, limit in zip("xyz", grid, GRID_LIMITS):
        if not 0 <= value <= limit:
            raise LaunchError(f"{what}: grid {tuple(grid)}: {axis} = {value} is outside [0, {limit}]", fix=_FIX)
    if block is None:
        return
    for axis, value, limit in zip("xyz", block, BLOCK_LIMITS):
        if not 1 <= value <= limit:
            raise LaunchError(f"{what}: block {tuple(block)}: {axis} = {value} is outside [1, {limit}]", fix=_FIX)
    if block[0] * block[1] * block[2] > MAX_BLOCK_THREADS:
        raise LaunchError(f"{what}: block {tuple(block)} has more than {MAX_BLOCK_THREADS} threads", fix=_FIX)


def _eval(expr: Any, values: Mapping[str, int]) -> int:
    if isinstance(expr, int):
        return expr
    if "var" in expr:
        return int(values[expr["var"]])
    op, args = expr["op"], expr["args"]
    if op == "select":
        return _eval(args[1], values) if _eval(args[0], values) else _eval(args[2], values)
    a, b = _eval(args[0], values), _eval(args[1], values)
    if op in ("//", "%") and b == 0:
        raise LaunchError("division by zero in a launch expression", fix=_FIX)
    return _BINARY[op](a, b)


def free_variables(expr: Any) -> set[str]:
    if isinstance(expr, int):
        return set()
    if "var" in expr:
        return {expr["var"]}
    out: set[str] = set()
    for a in expr["args"]:
        out |= free_variables(a)
    return out
