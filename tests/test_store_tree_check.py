"""The leader state's tree check (cruxd.leader.store._check_tree): no value deeper than
MAX_DEPTH, no integer outside the 64-bit range, decided as plainly as it is said, here
recursively, on any JSON document (hypothesis), and at the edges."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.leader import store

LO, HI = -(1 << 63), 1 << 64


def _plain(node: Any, depth: int = 0) -> str | None:
    """What is wrong with `node` at `depth`, by the definition (recursive)."""
    if depth > store.MAX_DEPTH:
        return "deep"
    if isinstance(node, bool):
        return None
    if isinstance(node, int):
        return None if LO <= node < HI else "int"
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for v in values:
        if (why := _plain(v, depth + 1)) is not None:
            return why
    return None


def _deepest(node: Any, depth: int = 0) -> int:
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    return max((_deepest(v, depth + 1) for v in values), default=depth)


def _checked(doc: Any) -> str | None:
    try:
        store._check_tree(doc)
    except ValueError as exc:
        return "deep" if "nested" in str(exc) else "int"
    return None


scalars = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False),
                    st.text(max_size=3), st.integers(LO - 5, LO + 5),
                    st.integers(HI - 5, HI + 5), st.integers(-10, 10))
trees = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=2), kids, max_size=4)),
    max_leaves=40)


def _nest(inner: Any, levels: int) -> Any:
    for i in range(levels):
        inner = [inner] if i % 2 else {"k": inner}
    return inner


@settings(max_examples=300, deadline=None)
@given(trees, st.integers(0, store.MAX_DEPTH + 3))
def test_the_check_decides_as_the_definition(tree: Any, levels: int) -> None:
    doc = json.loads(json.dumps(_nest(tree, levels)))  # as read: json's own types only
    got, want = _checked(doc), _plain(doc)
    # both find something wrong or neither does; which thing, when both are (a big int
    # too deep), depends on the walk's order
    assert (got is None) == (want is None), (got, want)
    if _deepest(doc) <= store.MAX_DEPTH:  # nothing too deep: only an int can be wrong
        assert got == want


@pytest.mark.parametrize("levels,ok", [(store.MAX_DEPTH, True), (store.MAX_DEPTH + 1, False)])
def test_the_depth_edge(levels: int, ok: bool) -> None:
    doc = _nest(1, levels)  # the value 1 sits `levels` deep
    assert (_checked(doc) is None) == ok
    assert (_checked(_nest([], levels)) is None) == ok  # an empty list that deep is a value
    assert _checked(_nest({}, levels - 1)) is None  # ... its container one level up is not


def test_integers_at_the_range_edges_and_bools() -> None:
    assert _checked([LO, HI - 1, True, False, 1.0e300]) is None
    assert _checked({"a": [HI]}) == "int"
    assert _checked({"a": [LO - 1]}) == "int"
    assert _checked(HI) == "int"  # a bare document too
