"""Laws of the selection as a value (treeclass/_selection.py): every reader agrees with it."""

from __future__ import annotations

import abc
import functools
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc
import treeclass.optim
from treeclass._at import selection
from treeclass._structure import is_wrapper


class Layer(tc.TreeClass):
    tag: str = tc.field(default="layer", static=True)

    def __init__(self, n: int, frozen: bool):
        self.w = jnp.arange(float(n))
        self.b = tc.freeze(jnp.zeros(1)) if frozen else jnp.zeros(1)
        self.steps = np.int32(n)


class Net(tc.TreeClass):
    def __init__(self, sizes, frozen):
        self.layers = [Layer(n, f) for n, f in zip(sizes, frozen, strict=True)]
        self.head = {"out": jnp.ones(2), "scale": 2.0}


@st.composite
def nets(draw):
    count = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 3), min_size=count, max_size=count))
    frozen = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    return Net(sizes, frozen)


def chains(net):
    """Selector chains of every kind, each valid on `net`."""
    n = len(net.layers)
    return st.sampled_from(
        [
            (...,),
            ("layers", n - 1, "w"),
            ("layers", slice(0, None, 2)),
            ("layers", ..., ("w", "b")),
            (Layer,),
            (Layer, "w"),
            (tc.glob("layers.*.w"),),
            (tc.glob("**.out"),),
            (tc.where(lambda path, x: getattr(x, "ndim", None) == 1),),
            (
                jax.tree_util.tree_map(
                    lambda x: not is_wrapper(x) and bool(np.size(x) % 2), net, is_leaf=is_wrapper
                ),
            ),
            (jax.Array,),
        ]
    )


def indexer(net, chain):
    return tc.at(net, where=list(chain))


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_the_selection_paths_are_the_paths_of_the_indexer(data):
    net = data.draw(nets())
    chain = data.draw(chains(net))
    at = indexer(net, chain)
    assert selection(at).paths() == at.paths()
    flags = selection(at).flags()
    pairs = jax.tree_util.tree_flatten_with_path(net)[0]
    assert [p for (p, _), f in zip(pairs, flags, strict=True) if f is not False] == at.paths()


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_get_and_set_agree_with_the_selection(data):
    net = data.draw(nets())
    chain = data.draw(chains(net))
    at = indexer(net, chain)
    flags = selection(at).flags()
    leaves = jax.tree_util.tree_leaves(net)
    got = jax.tree_util.tree_leaves(at.get(), is_leaf=lambda x: x is None)
    new = jax.tree_util.tree_leaves(at.apply(lambda x: x * 0 + 7))
    for leaf, flag, g, s in zip(leaves, flags, got, new, strict=True):
        if flag is False:
            assert g is None and s is leaf
        else:
            assert g is leaf
            assert np.all(np.asarray(s) == 7)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_the_optimizer_mask_is_the_selection_less_the_never_trained_leaves(data):
    net = data.draw(nets())
    chain = data.draw(chains(net))
    at = indexer(net, chain)
    flags = selection(at, is_wrapper).flags()
    roles = tc.roles(net)
    mask = tc.optim.mask(at, strict=False)
    places = jax.tree_util.tree_leaves(net, is_leaf=is_wrapper)
    role_of = jax.tree_util.tree_leaves(roles, is_leaf=is_wrapper)
    expected = [
        flag is True and not is_wrapper(x) and role not in ("frozen", "state")
        for x, flag, role in zip(places, flags, role_of, strict=True)
    ]
    assert jax.tree_util.tree_leaves(mask) == expected


def test_a_stack_gathers_one_flag_per_block():
    stack = tc.Stacked({"w": jnp.ones((4, 2))})
    flags = selection(tc.at(stack)[1:3]).flags()
    assert [f.tolist() for f in flags] == [[False, True, True, False]]


def test_a_name_chain_leaves_every_other_node_untouched():
    net = Net([1, 2, 3], [False] * 3)
    new = net.at["layers"][1]["w"].set(jnp.zeros(2))
    assert new.layers[0] is net.layers[0] and new.layers[2] is net.layers[2]
    assert new.head is net.head


def test_a_selection_that_names_nothing_says_so_when_read():
    net = Net([1], [False])
    with pytest.raises(LookupError, match="did you mean"):
        selection(tc.at(net)[tc.glob("layers.*.ww")]).flags()


def _outcome(thunk):
    try:
        return "ok", thunk()
    except Exception as error:  # compared by type and message
        return type(error), str(error)


def _never(_):
    return False


@settings(max_examples=30, deadline=None)
@given(
    st.data(),
    st.lists(
        st.sampled_from(["layers", "head", "w", "b", "out", "tag", "x", 0, 1, -1, 5]),
        min_size=1,
        max_size=4,
    ),
)
def test_a_chain_of_names_and_indices_agrees_with_the_walker(data, keys):
    # without `is_leaf` a chain of names and indices is run by the rows alone; a never-true
    # `is_leaf` sends the same chain through the walker: same tree, or same error
    net = data.draw(nets())
    at = tc.at(net, where=keys)
    new = jnp.full(3, 7.0)
    for op in (
        lambda **k: at.set(new, **k),
        lambda **k: at.set(0.5, **k),
        lambda **k: at.apply(lambda x: x, **k),
        lambda **k: at.apply(lambda x: [x], whole=True, **k),
        lambda **k: at.reduce(lambda count, _: count + 1, initializer=0, **k),
        lambda **k: at.pluck(**k),
    ):
        fast, walked = _outcome(op), _outcome(functools.partial(op, is_leaf=_never))
        assert fast[0] == walked[0]
        if fast[0] == "ok":
            assert jax.tree_util.tree_structure(fast[1]) == jax.tree_util.tree_structure(walked[1])
            assert all(
                a is b or np.array_equal(a, b)
                for a, b in zip(
                    jax.tree_util.tree_leaves(fast[1]), jax.tree_util.tree_leaves(walked[1])
                )
            )
        else:
            assert fast[1] == walked[1]


def _uncached(at, is_leaf=None):
    return selection(at, is_leaf).made_mask(None)


_LEAVES = st.sampled_from([1.0, 2, jnp.ones(2), np.zeros(3), tc.freeze(1), tc.freeze(jnp.ones(1))])


def _trees():
    return st.recursive(
        _LEAVES,
        lambda inner: st.one_of(
            st.dictionaries(st.sampled_from(["a", "b", "w"]), inner, min_size=1, max_size=3),
            st.lists(inner, min_size=1, max_size=3),
        ),
        max_leaves=8,
    )


_STRUCTURAL = st.sampled_from(
    [
        (...,),
        ("a",),
        ("w", ...),
        (..., "w"),
        (0,),
        (-1, ...),
        (slice(None, None, 2),),
        ((0, "b"),),
        (tc.glob("**.w"),),
        (re.compile("[ab]"), ...),
        (jax.Array,),
        (float, ...),
        (Layer,),
    ]
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_trees(), min_size=2, max_size=3), _STRUCTURAL, st.sampled_from([None, is_wrapper]))
def test_a_kept_selection_answers_as_a_fresh_walk(trees, chain, is_leaf):
    # the same selectors read on trees of the same or another structure, in turn: what the
    # cache answers (the second reading of each) is what a walk finds
    for tree in [*trees, trees[0], Net([1, 2], [True, False]), Net([1, 2], [False, True])]:
        at = tc.at(tree, where=list(chain))
        try:
            fresh = _uncached(at, is_leaf)
        except (LookupError, TypeError, IndexError) as error:
            with pytest.raises(type(error)):
                at.mask(is_leaf=is_leaf)
            continue
        for _ in range(2):
            assert tc.is_tree_equal(at.mask(is_leaf=is_leaf), fresh)
            assert selection(at, is_leaf).flags() == jax.tree_util.tree_leaves(
                fresh, is_leaf=is_leaf
            )


def test_a_kept_selection_follows_a_changed_structure():
    chain = ["layers", -1, "w"]
    small, big = Net([1, 2], [False] * 2), Net([1, 2, 3], [False] * 3)
    for _ in range(2):  # each read twice: the second one is the kept one
        assert [layer.w for layer in tc.at(small, where=chain).mask().layers] == [False, True]
        assert [layer.w for layer in tc.at(big, where=chain).mask().layers] == [False] * 2 + [True]


def test_selectors_that_read_values_are_never_answered_from_the_kept_ones():
    # two trees of one structure and leaf types, different values: a predicate, a mask tree
    # and a `BaseKey` decide by values or user code, so each reading walks again
    class Positive(tc.BaseKey):
        def __eq__(self, entry):
            return entry.key in positive

    first, second = {"a": 1.0, "b": -1.0}, {"a": -1.0, "b": 1.0}
    for _ in range(2):
        for tree in (first, second):
            positive = {k for k, v in tree.items() if v > 0}
            want = {k: v > 0 for k, v in tree.items()}
            assert tc.at(tree)[tc.where(lambda path, x: x > 0)].mask() == want
            assert tc.at(tree)[{k: bool(v) for k, v in want.items()}].mask() == want
            assert tc.at(tree)[Positive()].mask() == want


def test_a_kept_class_selection_follows_a_newly_registered_virtual_subclass():
    # an ABC's `register` changes what its `isinstance` says for the same leaf types
    class Marked(abc.ABC):
        @abc.abstractmethod
        def mark(self) -> None: ...

    Marked.register(int)
    tree = {"a": 1.0, "b": 1}
    for _ in range(2):
        assert tc.at(tree)[Marked].mask() == {"a": False, "b": True}
    Marked.register(float)
    assert tc.at(tree)[Marked].mask() == {"a": True, "b": True}


def test_a_protocol_selection_reads_each_leaf_and_is_never_kept():
    # a runtime-checkable `Protocol` decides by a leaf's attributes, not its type alone
    @typing.runtime_checkable
    class Named(typing.Protocol):
        name: str

    class Thing:
        pass

    named = Thing()
    named.name = "x"
    first, second = {"a": named, "b": Thing()}, {"a": Thing(), "b": named}
    for _ in range(2):
        assert tc.at(first)[Named].mask() == {"a": True, "b": False}
        assert tc.at(second)[Named].mask() == {"a": False, "b": True}


def test_kept_selections_of_one_kind_are_told_apart_by_what_they_select_by():
    # on one tree, selectors of a kind that differ only in their pattern, bounds or key
    tree = {"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]}
    chains = [
        [re.compile("a"), ...],
        [re.compile("b"), ...],
        [tc.glob("a.*")],
        [tc.glob("b.*")],
        [..., slice(0, 2)],
        [..., slice(1, None)],
        [..., slice(None, None, 2)],
        [..., slice(None, None)],
        [..., 0],
        [..., -1],
        [..., (0, 2)],
        [..., (1, 2)],
        [("a", re.compile("b")), 2],
    ]
    fresh = [_uncached(tc.at(tree, where=chain)) for chain in chains]
    for _ in range(2):
        for chain, want in zip(chains, fresh, strict=True):
            assert tc.at(tree, where=chain).mask() == want


class _NeverLeaf:
    """An `is_leaf` that does not hash (it defines `==`, as a dataclass does)."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other):
        return isinstance(other, _NeverLeaf)

    def __call__(self, _):
        return False


def test_an_is_leaf_that_does_not_hash_selects_all_the_same():
    tree = {"a": [1.0, 2.0], "b": 3.0}
    for _ in range(2):
        assert tc.at(tree)["a"][...].mask(is_leaf=_NeverLeaf()) == {"a": [True, True], "b": False}
        assert selection(tc.at(tree)[tc.glob("a.*")], _NeverLeaf()).flags() == [True, True, False]


def test_kept_selections_of_stacks_follow_their_count_of_blocks():
    # `[:2]` takes all of a stack of two blocks and half of one of four: a stack's count of
    # blocks is part of its structure, so each reading answers for its own stack
    block = {"w": jnp.ones(2)}
    trees = [
        tc.Stacked({"w": jnp.ones((2, 2))}),
        tc.Stacked({"w": jnp.ones((4, 2))}),
        tc.Periodic.from_layers([block, block], 2),
        tc.Periodic.from_layers([block] * 4, 2),
    ]
    want = [[True], [[True, True, False, False]], [True, True], [[True, False]] * 2]
    for _ in range(2):
        for tree, flags in zip(trees, want, strict=True):
            got = selection(tc.at(tree)[:2]).flags()
            assert [np.asarray(f).tolist() for f in got] == flags
            assert tc.is_tree_equal(tc.at(tree)[:2].mask(), _uncached(tc.at(tree)[:2]))
