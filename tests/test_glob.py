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


# -- captures: one language with key rules -------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "segments", "captures"),
    [
        ("layers.{i}.w", ("layers", "{i}", "w"), ("i",)),
        ("blocks[{i}].attn", ("blocks", "{i}", "attn"), ("i",)),
        ("a.{n:q|k}_proj.{rest*}", ("a", "{n:q|k}_proj", "{rest*}"), ("n", "rest")),
        ("['{x}']", ("{x}",), ()),  # quoted: a literal key, no capture
    ],
)
def test_glob_parses_captures(pattern, segments, captures):
    parsed = tc.glob(pattern)
    assert parsed.segments == segments
    assert tuple(c.name for c in parsed.captures) == captures


def test_a_capture_selects_like_a_wildcard_and_a_choice_among_its_values():
    tree = {"layers": [{"q_proj": 1, "k_proj": 2, "o_proj": 3}, {"q_proj": 4, "k_proj": 5}]}
    got = tc.at(tree)[tc.glob("layers.{i}.{n:q|k}_proj")].get(fill_value=0)
    assert got == {"layers": [{"q_proj": 1, "k_proj": 2, "o_proj": 0}, {"q_proj": 4, "k_proj": 5}]}
    deep = {"a": {"b": {"c": 1}}, "d": 2}
    # `{rest*}`: one level or more, as '*.**'
    assert tc.at(deep)[tc.glob("{rest*}.c")].get(fill_value=0) == {"a": {"b": {"c": 1}}, "d": 0}
    assert tc.at(deep)[tc.glob("a.{rest*}")].get(fill_value=0) == {"a": {"b": {"c": 1}}, "d": 0}


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("a.{i}.{i}", r"captures \{i\} twice: in a key rule that means equal values"),
        ("a.{i", r"Stray '\{' in 'a\.\{i'"),
        ("a.x}", r"Stray '\}'"),
        ("a.{1}", r"Stray '\{'"),
        ("a.x{r*}", r"takes one or more whole segments"),
        ("a[{r*}]", r"write it as a dotted segment"),
        ("a.{n:}", r"lists values wrongly"),
        ("a.{n*:x|y}", r"lists values wrongly"),
    ],
)
def test_glob_rejects_malformed_captures(pattern, message):
    with pytest.raises(ValueError, match=message):
        tc.glob(pattern)


def test_glob_and_a_key_rule_source_select_the_same_names():
    from treeclass._checkpoint.names._rules import compile_rules, source_hit

    tree = {"layers": [{"w": 1, "b": 2}, {"w": 3, "b": 4}], "w": 5}
    got = tc.at(tree)[tc.glob("layers.{i}.w")].get(fill_value=0)
    assert got == {"layers": [{"w": 1, "b": 0}, {"w": 3, "b": 0}], "w": 0}
    rules = compile_rules([("layers.{i}.w", "x.{i}")])
    names = ["layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b", "w"]
    assert [n for n in names if source_hit(rules, n)] == ["layers.0.w", "layers.1.w"]


_SEGMENT_NAMES = ["a", "b", "ab", "0", "1"]


def _pattern_segments(with_wildcards: bool) -> st.SearchStrategy[list[str]]:
    kinds = [st.sampled_from(_SEGMENT_NAMES), st.sampled_from(["['a']", "['ab']"])]
    kinds += [
        st.just("{c}"),
        st.just("a{c}"),
        st.sampled_from(["{c:a|0}", "{c:ab|b}"]),
        st.just("{c*}"),
    ]
    if with_wildcards:
        kinds += [st.sampled_from(["*", "?", "a*", "*b", "**", "[0]", "[*]"])]
    return st.lists(st.one_of(kinds), min_size=1, max_size=4)


def _numbered(segments: list[str]) -> str:
    """The segments as one pattern, each capture with a name of its own."""
    return ".".join(s.replace("{c", "{c" + str(k)) for k, s in enumerate(segments))


@settings(max_examples=150, deadline=None)
@given(
    _pattern_segments(with_wildcards=True),
    st.lists(st.sampled_from(_SEGMENT_NAMES), min_size=1, max_size=5),
)
def test_property_the_automaton_and_the_regex_of_a_pattern_agree(segments, name):
    from treeclass._glob import parse

    pattern = parse(_numbered(segments))
    state = pattern.start
    for segment in name:  # a digit is a sequence index in a tree
        state = pattern.advance(state, int(segment) if segment.isdigit() else segment)
    by_regex = pattern.regex().fullmatch(".".join(name)) is not None
    assert (pattern.accept in state) == by_regex


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.integers(0, 9),
        lambda c: st.dictionaries(st.sampled_from(["a", "b", "ab"]), c, min_size=1, max_size=3),
        max_leaves=8,
    ).filter(lambda t: isinstance(t, dict)),
    _pattern_segments(with_wildcards=False).filter(lambda s: all("0" not in p for p in s)),
)
def test_property_a_glob_selects_what_a_key_rule_with_its_source_reads(tree, segments):
    from treeclass._checkpoint.names._rules import compile_rules, source_hit

    pattern = _numbered(segments)
    rules = compile_rules([(pattern, pattern)])
    try:
        got = tc.at(tree)[tc.glob(pattern)].get(fill_value="-")
        flags = [leaf != "-" for leaf in jax.tree_util.tree_leaves(got)]
    except LookupError:  # a glob that selects nothing
        flags = [False] * len(jax.tree_util.tree_leaves(tree))
    # a glob selects a node with all below it: a leaf whose name or a prefix of it matches
    names = [
        [str(k.key) for k in path] for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]
    expected = [
        any(source_hit(rules, ".".join(parts[:k])) for k in range(1, len(parts) + 1))
        for parts in names
    ]
    assert flags == expected


def test_an_unquoted_bracket_key_whose_repr_holds_braces_is_no_capture():
    tree = {frozenset({1}): 3, frozenset({2}): 4}
    got = tc.at(tree)[tc.glob("[frozenset({1})]")].get(fill_value=0)
    assert got == {frozenset({1}): 3, frozenset({2}): 0}


def test_a_bracket_key_holding_brackets_is_one_segment():
    # a key whose text holds a nested `[...]` (here a custom key's repr): the inner `]`
    # closes the inner `[`, not the segment
    class Key:
        def __repr__(self):
            return "(1, [2])"

        def __lt__(self, other):
            return id(self) < id(other)

    key = Key()
    tree = {key: 1.0}
    assert tc.at(tree)[tc.glob("[(1, [2])]")].get() == {key: 1.0}
    with pytest.raises(ValueError, match="Unclosed '\\['"):
        tc.glob("[(1, [2]")
