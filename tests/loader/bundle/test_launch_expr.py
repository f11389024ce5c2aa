"""Launch expressions are data: validated strictly, evaluated without eval."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nojit.loader.errors import LaunchError
from nojit.loader.bundle.launch_expr import evaluate, free_variables, validate_expr

GRID = {"op": "//", "args": [{"op": "+", "args": [{"var": "num_tokens"}, 1]}, 2]}


def test_grid_over_several_token_counts():
    validate_expr(GRID, {"num_tokens"})
    assert [evaluate(GRID, {"num_tokens": n}) for n in (1, 7, 64, 513, 8192)] == [1, 4, 32, 257, 4096]
    assert free_variables(GRID) == {"num_tokens"}


@pytest.mark.parametrize("bad", [
    {"var": "split_k"}, {"op": "**", "args": [2, 3]}, {"op": "+", "args": [1]}, "num_tokens", 1.5, True,
    {"op": "+", "args": [1, 2], "extra": 1}, {"op": "__import__", "args": ["os", 1]}, [1, 2],
])
def test_malformed_expressions_are_refused(bad):
    with pytest.raises(ValueError):
        validate_expr(bad, {"num_tokens"})


def test_depth_is_bounded():
    e = 1
    for _ in range(40):
        e = {"op": "+", "args": [e, 1]}
    with pytest.raises(ValueError, match="deeply"):
        validate_expr(e, set())


def test_results_must_fit_a_grid_axis():
    """Negative, past 2^32 or dividing by zero at launch: a LaunchError (was a raw ValueError)."""
    with pytest.raises(LaunchError, match="outside"):
        evaluate({"op": "-", "args": [{"var": "n"}, 5]}, {"n": 1})
    with pytest.raises(LaunchError, match="outside"):
        evaluate({"op": "*", "args": [{"var": "n"}, 1 << 40]}, {"n": 3})
    with pytest.raises(LaunchError, match="division by zero"):
        evaluate({"op": "%", "args": [1, {"var": "n"}]}, {"n": 0})
    with pytest.raises(LaunchError, match="division by zero"):
        evaluate({"op": "//", "args": [1, {"var": "n"}]}, {"n": 0})


@given(st.integers(0, 1 << 20), st.integers(1, 64))
def test_ceil_div_matches_python(n, d):
    e = {"op": "//", "args": [{"op": "+", "args": [{"var": "n"}, d - 1]}, d]}
    assert evaluate(e, {"n": n}) == -(-n // d)


@pytest.mark.parametrize("bad", [{"var": []}, {"var": {}}, {"op": [], "args": [1, 2]}, {"op": {}, "args": [1, 2]},
                                 {"op": "select", "args": [1, 2]}, {"op": "+", "args": "ab"}])
def test_unhashable_or_odd_nodes_are_a_value_error(bad):
    with pytest.raises(ValueError):
        validate_expr(bad, {"num_tokens"})


def test_size_is_bounded():
    """A wide tree under the depth limit: 2^9 leaves is over the node cap, so its per-launch cost is refused."""
    e = {"var": "n"}
    for _ in range(9):
        e = {"op": "max", "args": [e, e]}
    with pytest.raises(ValueError, match="nodes"):
        validate_expr(e, {"n"})
    small = {"op": "max", "args": [{"var": "n"}, 3]}
    validate_expr(small, {"n"})
    assert evaluate(small, {"n": 7}) == 7
