"""Tests for the glob language of `tc.glob` (treeclass/_glob.py): syntax and matching."""

from __future__ import annotations

import importlib
import pathlib
import re
import textwrap

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc

# -- glob syntax -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "segments"),
    [
        ("layers.*.weight", ("layers", "*", "weight")),
        ("layers[0].weight", ("layers", "0", "weight")),
        (".a[0]['b']", ("a", "0", "b")),
        ("**.bias", ("**", "bias")),
        ("['a.b'].c", ("a.b", "c")),
        ('a["x"]', ("a", "x")),
        ("a[*]", ("a", "*")),
    ],
)
def test_glob_parses_segments(pattern, segments):
    assert tc.glob(pattern).segments == segments


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("a..b", "Empty segment in glob 'a..b'"),
        ("a.", "ends with '.'"),
        ("a]", r"Unbalanced '\]'"),
        ("a[0]b", r"Expected '\.' or '\[' after '\]'"),
        ("", "Empty glob pattern"),
        ("a[]", "Empty brackets"),
        ("a[0", r"Unclosed '\['"),
        ("a['x]", "Unclosed quote"),
    ],
)
def test_glob_rejects_malformed_patterns(pattern, message):
    with pytest.raises(ValueError, match=message):
        tc.glob(pattern)


def test_glob_needs_a_string():
    with pytest.raises(TypeError, match="pattern string"):
        tc.glob(3)


def test_glob_that_matches_nothing_is_an_error_naming_the_closest_key():
    tree = {"a": {"b": 1}}
    with pytest.raises(
        LookupError,
        match=r"(?s)glob\('a\.c'\) selects nothing.*after a, no key "
        r"matches 'c' \(keys there: 'b'\)",
    ):
        tc.at(tree)[tc.glob("a.c")].get()


def test_glob_wildcard_question_mark_and_index_names():
    tree = {"l": [10, 11, 12], "x1": 1, "x22": 2}
    assert tc.at(tree)[tc.glob("x?")].set(0) == {"l": [10, 11, 12], "x1": 0, "x22": 2}
    assert tc.at(tree)[tc.glob("l.[1]")].set(0)["l"] == [10, 0, 12]
    assert tc.at(tree)[tc.glob("l.*")].set(0)["l"] == [0, 0, 0]


def test_glob_selects_subtrees_then_relative_names():
    tree = {"blocks": [{"w": 1, "b": 2}, {"w": 3, "b": 4}]}
    new = tc.at(tree)[tc.glob("blocks.*")]["w"].set(0)
    assert new == {"blocks": [{"w": 0, "b": 2}, {"w": 0, "b": 4}]}


def test_glob_double_star_matches_zero_levels():
    tree = {"w": 1, "a": {"w": 2}}
    assert tc.at(tree)[tc.glob("**.w")].set(0) == {"w": 0, "a": {"w": 0}}


@settings(max_examples=30, deadline=None)
@given(
    st.recursive(
        st.integers(0, 9),
        lambda c: (
            st.dictionaries(st.sampled_from(["a", "b", "c.d", "e"]), c, min_size=1, max_size=3)
            | st.lists(c, min_size=1, max_size=3)
        ),
        max_leaves=6,
    ),
    st.data(),
)
def test_property_glob_of_keystr_selects_exactly_that_leaf(tree, data):
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    index = data.draw(st.integers(0, len(pairs) - 1))
    path = pairs[index][0]
    if not path:
        return  # a bare leaf has an empty path
    got = tc.at(tree)[tc.glob(jax.tree_util.keystr(path))].get(fill_value="-")
    flags = [leaf != "-" for leaf in jax.tree_util.tree_leaves(got)]
    assert flags == [i == index for i in range(len(pairs))]


def test_glob_returns_one_object_per_pattern():
    assert tc.glob("a.*") is tc.glob("a.*")
    assert tc.glob("a.*") is not tc.glob("a.b")


def test_glob_docstring_example_runs():
    source = pathlib.Path(importlib.import_module("treeclass._glob").__file__).read_text()
    blocks = re.findall(r"```python\n(.*?)```", source, re.S)
    assert blocks
    for block in blocks:
        exec(textwrap.dedent(block), {})
