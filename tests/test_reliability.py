"""No silent wrong results: adversarial tests, one section per rule.

Each section tests one rule through the public API, as a careful user who
tries odd inputs would: every edge case gives the right answer or a clear error, and every
operation that fails leaves its inputs exactly as they were. Where a rule is a law
(exact static round trips, `keystr(path)` as a glob, `.at[mask]` against a `jnp.where`
reference, escape-hatch writes against flatten) it is a hypothesis property.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import inspect
import math
import pickle
import re
import struct
import threading
import uuid
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Linear
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treeclass as tc
from treeclass import _node

SETTINGS = dict(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Pair = collections.namedtuple("Pair", "first second")
Point = collections.namedtuple("Point", "a b")


# -- helpers -------------------------------------------------------------------------------------


def exact(value: Any) -> Any:
    """The test's own oracle of "the same value": type plus bits, recursively."""
    kind = type(value)
    if isinstance(value, np.generic):
        return (kind, value.dtype.str, value.tobytes())
    if isinstance(value, float):
        return (kind, struct.pack("<d", value))
    if isinstance(value, complex):
        return (kind, struct.pack("<dd", value.real, value.imag))
    if isinstance(value, tuple):
        return (kind, tuple(exact(v) for v in value))
    if isinstance(value, frozenset):
        return (kind, frozenset(exact(v) for v in value))
    return (kind, value)


def same_leaf(a: Any, b: Any) -> bool:
    if isinstance(a, (np.ndarray, jax.Array)) or isinstance(b, (np.ndarray, jax.Array)):
        if type(a) is not type(b):
            return False
        x, y = np.asarray(a), np.asarray(b)
        return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
    try:
        return exact(a) == exact(b)
    except TypeError:
        return a is b or a == b


def snapshot(tree: Any) -> Any:
    """What a tree is now: its structure (static values, frozen values) and its leaves' bits."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    copies = [np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in leaves]
    state = None
    if isinstance(tree, tc.TreeClass):
        state = dict(vars(tree))
    return treedef, copies, state


def assert_unchanged(tree: Any, before: Any) -> None:
    treedef, leaves, state = before
    now_leaves, now_treedef = jax.tree_util.tree_flatten(tree)
    assert now_treedef == treedef
    assert len(now_leaves) == len(leaves)
    for old, new in zip(leaves, now_leaves):
        assert same_leaf(old, new), (old, new)
    if state is not None:
        assert list(vars(tree)) == list(state)


def assert_tree_unchanged(tree: Any, before: Any) -> None:
    """The tree JAX sees is what it was (attributes outside the tree may differ)."""
    assert_unchanged(tree, (*before[:2], None))


def raises_unchanged(error: Any, fn: Any, *inputs: Any) -> BaseException:
    """`fn()` raises `error`, and each of `inputs` is what it was before the call."""
    before = [snapshot(x) for x in inputs]
    with pytest.raises(error) as info:
        fn()
    for x, b in zip(inputs, before):
        assert_unchanged(x, b)
    return info.value


def notes(error: BaseException) -> list[str]:
    return [n for n in getattr(error, "__notes__", []) if "JAX_TRACEBACK" not in n]


def traced(fn: Any) -> tuple[Any, list[Any]]:
    """`jax.jit(fn)` and the list of its traces (one entry per trace)."""
    log: list[Any] = []

    def counting(*args: Any) -> Any:
        log.append(args)
        return fn(*args)

    return jax.jit(counting), log


# -- shared classes ------------------------------------------------------------------------------


class Tagged(tc.TreeClass):
    x: Any
    tag: Any = tc.field(static=True)


class HandTagged(tc.TreeClass):
    tag: Any = tc.field(static=True)

    def __init__(self, x: Any, tag: Any) -> None:
        self.x = x
        self.tag = tag


class Net(tc.TreeClass):
    layers: Any


def make_net() -> Net:
    return Net((Linear(jnp.ones(2), jnp.zeros(2)), Linear(jnp.ones(2), -jnp.ones(2))))


# ================================================================================================
# Rule 1: a static value comes back exactly as given
# ================================================================================================

_floats = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf]))
_numpy_scalars = st.one_of(
    _floats.map(np.float64),
    st.floats(width=32).map(np.float32),
    st.floats(width=16).map(np.float16),
    st.integers(-(2**31), 2**31 - 1).map(np.int32),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 255).map(np.uint8),
    st.booleans().map(np.bool_),
    st.builds(lambda r, i: np.complex64(complex(r, i)), st.floats(width=32), st.floats(width=32)),
    st.tuples(st.integers(-1000, 1000), st.sampled_from(["D", "s"])).map(
        lambda a: np.datetime64(*a)
    ),
)
_atoms = st.one_of(
    st.integers(),
    _floats,
    st.booleans(),
    st.builds(complex, _floats, _floats),
    _numpy_scalars,
    st.text(max_size=4),
    st.binary(max_size=4),
    st.none(),
)
statics = st.recursive(
    _atoms,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3).map(tuple),
        st.frozensets(kids, max_size=3),
        st.builds(Pair, kids, kids),
    ),
    max_leaves=6,
)


def equal_copy(value: Any) -> Any:
    """A distinct object with exactly the same value (a fresh NaN, a new tuple)."""
    return pickle.loads(pickle.dumps(value))


@settings(**SETTINGS)
@given(value=statics, seen_first=statics)
def test_static_value_round_trips_exactly_through_every_route(value, seen_first):
    Tagged(jnp.zeros(()), seen_first)  # an "equal" value seen first must not be served
    HandTagged(jnp.zeros(()), seen_first)
    for cls in (Tagged, HandTagged):
        tree = cls(jnp.zeros(()), value)
        routes = {
            "attribute": tree,
            "tree_map": jax.tree_util.tree_map(lambda x: x, tree),
            "unflatten": jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(tree))),
            "jit": jax.jit(lambda t: t)(tree),
            "pickle": pickle.loads(pickle.dumps(tree)),
            "deepcopy": copy.deepcopy(tree),
            "at": tree.at["x"].set(1.0),
        }
        for route, out in routes.items():
            assert exact(out.tag) == exact(value), (cls.__name__, route, value, out.tag)


@settings(**SETTINGS)
@given(data=st.data(), a=statics)
def test_jit_reuses_a_trace_exactly_when_static_values_are_exactly_equal(data, a):
    b = data.draw(st.one_of(st.just(equal_copy(a)), statics), label="b")
    for cls in (Tagged, HandTagged):
        f, log = traced(lambda t: t.x)
        f(cls(jnp.ones(()), a))
        f(cls(jnp.ones(()), b))
        assert len(log) == (1 if exact(a) == exact(b) else 2), (a, b)
        assert exact(log[-1][0].tag) == exact(b)
        same_def = jax.tree_util.tree_structure(cls(1.0, a)) == jax.tree_util.tree_structure(
            cls(1.0, b)
        )
        assert same_def == (exact(a) == exact(b))


@settings(**SETTINGS)
@given(data=st.data(), a=statics)
def test_frozen_values_are_equal_and_share_a_trace_exactly_when_exactly_equal(data, a):
    b = data.draw(st.one_of(st.just(equal_copy(a)), statics), label="b")
    fa, fb = tc.freeze(a), tc.freeze(b)
    assert exact(tc.unfreeze(fa)) == exact(a)
    assert (fa == fb) == (exact(a) == exact(b))
    if fa == fb:
        assert hash(fa) == hash(fb)
    f, log = traced(lambda t: t["x"])
    f({"x": jnp.ones(()), "f": fa})
    f({"x": jnp.ones(()), "f": fb})
    assert len(log) == (1 if exact(a) == exact(b) else 2)
    assert exact(tc.unfreeze(log[-1][0]["f"])) == exact(b)


SIGNED_ZEROS = [
    (0.0, -0.0, lambda v: v),
    (np.float64(0.0), np.float64(-0.0), lambda v: v),
    (np.float32(0.0), np.float32(-0.0), lambda v: v),
    (np.float16(0.0), np.float16(-0.0), lambda v: v),
    (complex(1.0, 0.0), complex(1.0, -0.0), lambda v: v.imag),
    (complex(0.0, 1.0), complex(-0.0, 1.0), lambda v: v.real),
    (np.complex128(complex(1.0, 0.0)), np.complex128(complex(1.0, -0.0)), lambda v: v.imag),
    ((0.0,), (-0.0,), lambda v: v[0]),
    (("a", (0.0,)), ("a", (-0.0,)), lambda v: v[1][0]),
    (Pair(0.0, 1), Pair(-0.0, 1), lambda v: v.first),
    (frozenset({np.float64(0.0)}), frozenset({np.float64(-0.0)}), lambda v: next(iter(v))),
]


@pytest.mark.parametrize("positive, negative, zero_of", SIGNED_ZEROS)
def test_jit_divides_by_the_sign_of_the_static_zero_it_was_given(positive, negative, zero_of):
    for cls in (Tagged, HandTagged):
        f = jax.jit(lambda t: t.x / zero_of(t.tag))
        assert float(f(cls(jnp.float32(1.0), positive))) == math.inf
        assert float(f(cls(jnp.float32(1.0), negative))) == -math.inf
        again = jax.tree_util.tree_map(lambda x: x, cls(1.0, negative))
        assert math.copysign(1.0, zero_of(again.tag)) == -1.0
        assert np.signbit(zero_of(again.tag))
        assert type(again.tag) is type(negative)


@pytest.mark.parametrize("positive, negative, zero_of", SIGNED_ZEROS)
def test_frozen_signed_zeros_do_not_share_a_trace(positive, negative, zero_of):
    f = jax.jit(lambda x, frozen: x / zero_of(tc.unfreeze(frozen)))
    assert float(f(jnp.float32(1.0), tc.freeze(positive))) == math.inf
    assert float(f(jnp.float32(1.0), tc.freeze(negative))) == -math.inf
    g = jax.jit(lambda tree: tree["x"] / zero_of(tc.unfreeze(tree["z"])))
    assert float(g({"x": jnp.float32(1.0), "z": tc.freeze(positive)})) == math.inf
    assert float(g({"x": jnp.float32(1.0), "z": tc.freeze(negative)})) == -math.inf


@pytest.mark.parametrize(
    "values",
    [
        (1, True, 1.0, np.int32(1), np.int64(1), np.float32(1.0), np.bool_(True), complex(1, 0)),
        ((1,), (True,), (1.0,), Pair(1, 1), Point(1, 1)),
        (np.datetime64(1, "D"), np.datetime64(86400, "s")),
    ],
)
def test_values_equal_in_python_but_of_other_types_never_share_a_trace(values):
    assert len({exact(v) for v in values}) == len(values)
    f, log = traced(lambda t: jnp.asarray(t.x))
    for v in values:
        out = jax.jit(lambda t: t)(Tagged(0.0, v))
        assert exact(out.tag) == exact(v)
        f(Tagged(0.0, v))
    assert len(log) == len(values)


def test_jit_output_dtype_follows_the_static_type_not_an_equal_one():
    f = jax.jit(lambda t: jnp.asarray(t.tag))
    assert f(Tagged(0.0, 1)).dtype == jnp.asarray(1).dtype
    assert f(Tagged(0.0, True)).dtype == jnp.bool_
    assert f(Tagged(0.0, 1.0)).dtype == jnp.asarray(1.0).dtype


@pytest.mark.parametrize(
    "make_nan",
    [
        lambda: float("nan"),
        lambda: np.float64("nan"),
        lambda: np.float32("nan"),
        lambda: (float("nan"), 1),
        lambda: complex(float("nan"), 0.0),
    ],
)
def test_a_fresh_nan_static_does_not_retrace_every_call(make_nan):
    for cls in (Tagged, HandTagged):
        f, log = traced(lambda t: t.x)
        for _ in range(6):
            f(cls(jnp.ones(()), make_nan()))
        assert len(log) == 1
    g, log = traced(lambda t: t["x"])
    for _ in range(6):
        g({"x": jnp.ones(()), "n": tc.freeze(make_nan())})
    assert len(log) == 1


def test_nans_with_other_bits_are_other_statics():
    quiet = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000))[0]
    payload = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    negative = -quiet
    f, log = traced(lambda t: t.x)
    for value in (quiet, payload, negative):
        out = jax.tree_util.tree_map(lambda x: x, Tagged(1.0, value))
        assert struct.pack("<d", out.tag) == struct.pack("<d", value)
        f(Tagged(jnp.ones(()), value))
    assert len(log) == 3


def test_unhashable_static_inside_nested_tuples_names_the_field():
    with pytest.raises(TypeError, match=r"Tagged\.tag"):
        Tagged(1.0, (1, (2, [3])))


# ================================================================================================
# Rule 2: freezing snapshots its value
# ================================================================================================


def _numpy_containers():
    return [
        ("array", lambda a: a, lambda v: v),
        ("dict", lambda a: {"a": a}, lambda v: v["a"]),
        ("tuple", lambda a: (a, 1), lambda v: v[0]),
        ("list", lambda a: [a], lambda v: v[0]),
        ("treeclass", lambda a: Tagged(a, "t"), lambda v: v.x),
    ]


@pytest.mark.parametrize("name, wrap, unwrap", _numpy_containers())
def test_freeze_snapshots_a_writable_numpy_array(name, wrap, unwrap):
    original = np.arange(3.0)
    frozen = tc.freeze(wrap(original))
    f = lambda x, fr: x + jnp.asarray(unwrap(tc.unfreeze(fr)))
    jitted = jax.jit(f)
    first = jitted(jnp.zeros(3), frozen)
    original[0] = 100.0  # in place, after freezing
    assert np.asarray(unwrap(tc.unfreeze(frozen))).tolist() == [0.0, 1.0, 2.0]
    assert jitted(jnp.zeros(3), frozen).tolist() == first.tolist()
    assert jitted(jnp.zeros(3), frozen).tolist() == f(jnp.zeros(3), frozen).tolist()
    assert tc.freeze(wrap(np.arange(3.0))) == frozen


def test_freeze_snapshots_a_list_container_against_later_appends():
    items = [1.0, 2.0]
    frozen = tc.freeze(items)
    items.append(3.0)
    assert tc.unfreeze(frozen) == [1.0, 2.0]
    assert frozen == tc.freeze([1.0, 2.0])


def test_a_frozen_numpy_array_cannot_be_written_through_unfreeze():
    frozen = tc.freeze(np.zeros(3))
    with pytest.raises(ValueError):
        tc.unfreeze(frozen)[0] = 1.0
    assert tc.unfreeze(frozen).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "make_view",
    [
        lambda base: np.broadcast_to(base, (2, 3)),
        lambda base: _read_only(base[:]),
    ],
)
def test_freeze_snapshots_a_read_only_view_of_a_writable_buffer(make_view):
    # read-only is not immutable: the view sees every write into its writable base
    base = np.zeros(3)
    view = make_view(base)
    assert not view.flags.writeable
    frozen = tc.freeze(view)
    f = jax.jit(lambda x, fr: x + jnp.sum(jnp.asarray(tc.unfreeze(fr))))
    before = float(f(jnp.zeros(()), frozen))
    base[0] = 7.0
    assert float(np.sum(tc.unfreeze(frozen))) == 0.0
    assert float(f(jnp.zeros(()), frozen)) == before


class _ArraySubclass(np.ndarray):
    pass


def test_freeze_snapshots_a_numpy_array_subclass():
    original = np.zeros(3).view(_ArraySubclass)
    frozen = tc.freeze(original)
    f = jax.jit(lambda x, fr: x + jnp.sum(jnp.asarray(np.asarray(tc.unfreeze(fr)))))
    before = float(f(jnp.zeros(()), frozen))
    original[0] = 5.0
    assert float(np.sum(tc.unfreeze(frozen))) == 0.0
    assert float(f(jnp.zeros(()), frozen)) == before


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def test_a_writable_numpy_array_as_a_field_default_is_refused():
    with pytest.raises(TypeError, match="factory"):

        class Model(tc.TreeClass):
            w: Any = np.ones(3)

    with pytest.raises(TypeError, match="factory"):

        class Model2(tc.TreeClass):
            w: Any = tc.field(default=np.ones(3))

    with pytest.raises(TypeError, match="factory"):

        @tc.autoinit
        class Plain:
            w: Any = np.ones(3)


def test_a_numpy_array_default_is_refused_even_when_read_only():
    # its owner can make a read-only array writable again: every instance would share it
    table = _read_only(np.ones(3))
    with pytest.raises(TypeError, match=r"(?s)NumPy array.*factory"):

        class Model(tc.TreeClass):
            w: Any = table

    with pytest.raises(TypeError, match="NumPy array"):

        class Nested(tc.TreeClass):
            w: Any = (1.0, np.ones(2))


def test_a_read_only_view_of_a_writable_buffer_is_not_a_shared_default():
    base = np.zeros(3)
    view = np.broadcast_to(base, (3,))
    try:

        class Model(tc.TreeClass):
            w: Any = view
    except TypeError:
        return  # refused, as a writable array is
    first = Model()
    base[0] = 9.0  # every instance shares `view`'s buffer
    assert Model().w.tolist() == [0.0, 0.0, 0.0]
    assert first.w.tolist() == [0.0, 0.0, 0.0]


# ================================================================================================
# Rule 3: autoinit never replaces a hand-written __init__
# ================================================================================================


def test_autoinit_keeps_a_hand_written_init_of_a_treeclass():
    calls = []

    @tc.autoinit
    class Custom(tc.TreeClass):
        a: int = 1

        def __init__(self, v):
            calls.append(v)
            self.a = v * 10

    assert Custom(2).a == 20 and calls == [2]
    assert list(inspect.signature(Custom.__init__).parameters) == ["self", "v"]
    assert tc.autoinit(Custom)(3).a == 30  # idempotent


def test_autoinit_keeps_a_hand_written_init_of_a_plain_class():
    @tc.autoinit
    class Custom:
        a: int = 1

        def __init__(self, v):
            self.a = v * 10

    assert Custom(2).a == 20
    assert tc.autoinit(Custom)(3).a == 30


def test_autoinit_keeps_a_subclass_body_init_over_a_generated_parent():
    class Parent(tc.TreeClass):
        a: int
        b: int = 2

    @tc.autoinit
    class Child(Parent):
        c: int = 3

        def __init__(self, total):
            super().__init__(total, total)
            self.c = -total

    child = Child(5)
    assert (child.a, child.b, child.c) == (5, 5, -5)
    with pytest.raises(TypeError):
        Child(1, 2, 3)


def test_autoinit_keeps_a_body_init_whose_class_also_defines_post_init():
    @tc.autoinit
    class Custom(tc.TreeClass):
        a: int = 1

        def __init__(self, v):
            self.a = v

        def __post_init__(self):  # never called by a hand-written __init__
            raise AssertionError("the generated __init__ ran")

    assert Custom(4).a == 4


# ================================================================================================
# Rule 4: an empty selection is an error wherever a user names something
# ================================================================================================


def _layers_tree():
    return {"layers": [{"weight": 1.0, "bias": 0.0}, {"weight": 2.0, "bias": 0.5}]}


class _NeverKey(tc.BaseKey):
    def __eq__(self, entry):
        return False

    def __repr__(self):
        return "NeverKey()"


@pytest.mark.parametrize(
    "selector, selector_text, suggestion",
    [
        (tc.glob("layers.*.wieght"), "layers.*.wieght", "layers.*.weight"),
        (tc.glob("layers[0].wieght"), "layers[0].wieght", "weight"),
        (tc.glob("**.bais"), "**.bais", "bias"),
        (tc.glob("layer"), "layer", "layers"),
        (re.compile("lyers"), "lyers", "layers"),
    ],
)
@pytest.mark.parametrize("op", ["get", "set", "apply", "reduce", "scan"])
def test_a_glob_or_regex_that_matches_nothing_raises_naming_it_and_the_closest_key(
    selector, selector_text, suggestion, op
):
    tree = _layers_tree()
    indexer = tc.at(tree)[selector]
    run = {
        "get": lambda: indexer.get(),
        "set": lambda: indexer.set(0.0),
        "apply": lambda: indexer.apply(abs),
        "reduce": lambda: indexer.reduce(lambda a, b: a + b, initializer=0.0),
        "scan": lambda: indexer.scan(lambda x, s: (x, s), 0),
    }[op]
    error = raises_unchanged(LookupError, run, tree)
    assert selector_text in str(error)
    assert "did you mean" in str(error) and suggestion in str(error)


def test_a_regex_after_a_path_that_matches_nothing_raises():
    tree = _layers_tree()
    error = raises_unchanged(
        LookupError, lambda: tc.at(tree)["layers"][0][re.compile("w.*t2")].get(), tree
    )
    assert "w.*t2" in str(error) and "weight" in str(error)


def test_a_base_key_that_matches_nothing_raises_naming_it_and_the_keys_there():
    tree = _layers_tree()
    error = raises_unchanged(LookupError, lambda: tc.at(tree)[_NeverKey()].set(0.0), tree)
    assert "NeverKey()" in str(error) and "layers" in str(error)
    error = raises_unchanged(LookupError, lambda: tc.at(tree)["layers"][0][_NeverKey()].get(), tree)
    assert "weight" in str(error)


def test_a_typo_in_one_member_of_a_union_is_not_hidden_by_the_other_member():
    tree = _layers_tree()
    error = raises_unchanged(
        LookupError, lambda: tc.at(tree)["layers"][0]["weight", tc.glob("bais")].set(0.0), tree
    )
    assert "bais" in str(error) and "bias" in str(error)
    raises_unchanged(
        LookupError, lambda: tc.at(tree)["layers"][0]["weight", re.compile("bais")].set(0.0), tree
    )


def test_a_glob_typo_on_a_treeclass_names_the_closest_key():
    net = make_net()
    error = raises_unchanged(LookupError, lambda: net.at[tc.glob("layers.*.wieght")].get(), net)
    assert "did you mean" in str(error) and "layers.*.weight" in str(error)


def test_a_literal_glob_typo_hints_like_the_name_chain():
    tree = _layers_tree()
    by_name = raises_unchanged(LookupError, lambda: tc.at(tree)["layers"][0]["wieght"].get(), tree)
    by_glob = raises_unchanged(
        LookupError, lambda: tc.at(tree)[tc.glob("layers[0].wieght")].get(), tree
    )
    for error in (by_name, by_glob):
        assert "did you mean" in str(error) and "weight" in str(error)


def test_a_glob_reaching_only_a_static_field_is_an_error():
    net = make_net()
    raises_unchanged(LookupError, lambda: net.at[tc.glob("layers.*.name")].set("x"), net)


@pytest.mark.parametrize("op", ["get", "set", "apply"])
def test_bool_masks_and_where_selecting_nothing_are_empty_at_selections(op):
    tree = _layers_tree()
    nothing = jax.tree_util.tree_map(lambda _: False, tree)
    for selector in (nothing, tc.where(lambda path, node: False), False):
        indexer = tc.at(tree)[selector]
        if op == "get":
            out = indexer.get()
        elif op == "set":
            out = indexer.set(5.0)
        else:
            out = indexer.apply(lambda x: x + 1)
        if op == "get":
            assert jax.tree_util.tree_leaves(out) == []
        else:
            assert out == tree
        assert tc.at(tree)[selector].reduce(lambda a, b: a + b, initializer=0.0) == 0.0


def test_optim_mask_of_an_empty_selection_raises_unless_not_strict():
    tree = _layers_tree()
    nothing = jax.tree_util.tree_map(lambda _: False, tree)
    for selection in (
        tc.at(tree)[nothing],
        tc.at(tree)[tc.where(lambda p, n: False)],
        tc.at(tree)[int],
    ):
        raises_unchanged(ValueError, lambda selection=selection: tc.optim.mask(selection), tree)
        lenient = tc.optim.mask(selection, strict=False)
        assert jax.tree_util.tree_leaves(lenient) == [False] * 4
    raises_unchanged(ValueError, lambda: tc.optim.mask(tree, nothing), tree)
    raises_unchanged(LookupError, lambda: tc.optim.mask(tree, tc.glob("**.wieght")), tree)


def test_optim_mask_of_a_selection_of_only_frozen_values_raises_unless_not_strict():
    tree = {"w": tc.freeze(jnp.ones(2)), "b": jnp.zeros(2)}
    raises_unchanged(ValueError, lambda: tc.optim.mask(tree, "w"), tree)
    assert tc.optim.mask(tree, "w", strict=False)["b"] is False


def test_optim_labels_with_a_label_that_selects_nothing_raises_unless_not_strict():
    tree = _layers_tree()
    empty = {"decay": tc.where(lambda p, n: False), "plain": tc.glob("**.bias")}
    error = raises_unchanged(ValueError, lambda: tc.optim.labels(tree, empty), tree)
    assert "decay" in str(error)
    labels = tc.optim.labels(tree, empty, strict=False)
    assert "decay" not in jax.tree_util.tree_leaves(labels.tree)
    raises_unchanged(LookupError, lambda: tc.optim.labels(tree, {"d": tc.glob("**.wieght")}), tree)
    frozen = {"w": tc.freeze(jnp.ones(2)), "b": jnp.zeros(2)}
    raises_unchanged(ValueError, lambda: tc.optim.labels(frozen, {"d": "w"}), frozen)


def test_optim_partition_passes_strict_through():
    optax = pytest.importorskip("optax")
    tree = {"w": jnp.ones(2), "b": jnp.zeros(2)}
    transforms = {"decay": optax.sgd(0.1), "rest": optax.sgd(0.1)}
    selections = {"decay": tc.where(lambda p, n: False)}
    raises_unchanged(ValueError, lambda: tc.optim.partition(transforms, tree, selections), tree)
    tc.optim.partition(transforms, tree, selections, strict=False).init(tree)


@pytest.mark.parametrize("strict", ["yes", 1, None])
def test_optim_strict_must_be_a_bool(strict):
    tree = {"w": jnp.ones(2), "b": jnp.zeros(2)}
    error = raises_unchanged(TypeError, lambda: tc.optim.mask(tree, "w", strict=strict), tree)
    assert "strict" in str(error)
    error = raises_unchanged(
        TypeError, lambda: tc.optim.labels(tree, {"d": "w"}, strict=strict), tree
    )
    assert "strict" in str(error)


# ================================================================================================
# Rule 5: a selector means the same thing wherever it sits
# ================================================================================================


def test_a_mask_after_a_path_applies_to_the_node_it_follows():
    tree = [[1.0, 2.0], [3.0, 4.0]]
    mask = [True, False]  # fits tree[0] and, as a prefix, the whole tree
    assert tc.at(tree)[0][mask].set(0.0) == [[0.0, 2.0], [3.0, 4.0]]
    assert tc.at(tree)[mask].set(0.0) == [[0.0, 0.0], [3.0, 4.0]]
    assert tc.at(tree)[0][mask].get() == [[1.0, None], [None, None]]
    net = make_net()
    layer_mask = Linear(True, False)
    out = net.at["layers"][1][layer_mask].apply(lambda x: x + 10)
    assert out.layers[1].weight.tolist() == [11.0, 11.0]
    assert out.layers[1].bias.tolist() == [-1.0, -1.0]
    assert out.layers[0].weight.tolist() == [1.0, 1.0]
    out = net.at[Linear][layer_mask].apply(lambda x: x + 10)  # after a type: each Linear
    assert [layer.weight.tolist() for layer in out.layers] == [[11.0, 11.0]] * 2
    assert [layer.bias.tolist() for layer in out.layers] == [[0.0, 0.0], [-1.0, -1.0]]


_nested = st.recursive(
    st.floats(-10, 10),
    lambda kids: st.lists(kids, min_size=1, max_size=3),
    max_leaves=8,
).filter(lambda t: isinstance(t, list))


@settings(**SETTINGS)
@given(tree=_nested, data=st.data())
def test_a_mask_after_any_path_equals_the_reference_at_that_node(tree, data):
    path, node = [], tree
    while isinstance(node, list) and data.draw(st.booleans(), label="deeper"):
        index = data.draw(st.integers(0, len(node) - 1), label="index")
        path.append(index)
        node = node[index]
    mask = jax.tree_util.tree_map(lambda _: data.draw(st.booleans(), label="flag"), node)
    indexer = tc.at(tree)
    for index in path:
        indexer = indexer[index]
    got = indexer[mask].set(-100.0)
    expected_node = jax.tree_util.tree_map(lambda m, x: -100.0 if m else x, mask, node)
    expected = tc.at(tree)
    for index in path:
        expected = expected[index]
    expected = expected.set(expected_node) if path else expected_node
    assert got == expected


_dict_keys = st.one_of(
    st.text(max_size=6),
    st.text(alphabet=".[]'\"*?\\ \u00e9\u4e2d\U0001f600\n\x00", max_size=6),
    st.sampled_from(
        [
            "",
            "a.b",
            "w[0]",
            "['x']",
            "*",
            "?",
            "\\",
            "'",
            '"',
            "a'b\"c",
            "**",
            "0",
            "[0]",
            ".",
            "..",
            "]",
            "[",
        ]
    ),
)
_glob_trees = st.recursive(
    st.integers(0, 9),
    lambda kids: st.one_of(
        st.dictionaries(_dict_keys, kids, min_size=1, max_size=4),
        st.dictionaries(st.integers(-3, 20), kids, min_size=1, max_size=3),
        st.lists(kids, min_size=1, max_size=3),
    ),
    max_leaves=10,
)


@settings(**SETTINGS)
@given(tree=_glob_trees)
def test_keystr_of_a_path_used_as_a_glob_selects_exactly_that_path(tree):
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, _ in pairs:
        pattern = jax.tree_util.keystr(path)
        if not path:
            continue
        selected = tc.at(tree)[tc.glob(pattern)].get()
        chosen = [p for p, x in jax.tree_util.tree_flatten_with_path(selected)[0]]
        assert chosen == [path], (pattern, chosen)
        marked = tc.at(tree)[tc.glob(pattern)].set("hit")
        hits = [p for p, x in jax.tree_util.tree_flatten_with_path(marked)[0] if x == "hit"]
        assert hits == [path], pattern
        # every prefix of the path selects exactly the subtree there
        for cut in range(1, len(path)):
            prefix = jax.tree_util.keystr(path[:cut])
            under = [
                p
                for p, _ in jax.tree_util.tree_flatten_with_path(
                    tc.at(tree)[tc.glob(prefix)].get()
                )[0]
            ]
            assert under == [p for p, _ in pairs if p[:cut] == path[:cut]], prefix


def _shapes():
    return st.lists(st.integers(1, 3), max_size=3).map(tuple)


@settings(**{**SETTINGS, "max_examples": 25})
@given(
    leaf_shape=_shapes(),
    mask_shape=_shapes(),
    op=st.sampled_from(["get", "get_fill", "set", "apply", "reduce", "scan"]),
)
def test_an_element_mask_never_changes_the_shape_of_its_leaf(leaf_shape, mask_shape, op):
    tree = {"p": {"w": jnp.arange(math.prod(leaf_shape), dtype=jnp.float32).reshape(leaf_shape)}}
    mask = {"p": {"w": jnp.ones(mask_shape, bool)}}
    try:
        fits = np.broadcast_shapes(mask_shape, leaf_shape) == leaf_shape
    except ValueError:
        fits = False
    indexer = tc.at(tree)[mask]
    run = {
        "get": lambda: indexer.get(),
        "get_fill": lambda: indexer.get(fill_value=0.0)["p"]["w"],
        "set": lambda: indexer.set(1.0)["p"]["w"],
        "apply": lambda: indexer.apply(lambda x: x + 1)["p"]["w"],
        "reduce": lambda: indexer.reduce(lambda a, x: a + x.sum(), initializer=0.0),
        "scan": lambda: indexer.scan(lambda x, s: (x + 1, s), 0)[0]["p"]["w"],
    }[op]
    if fits:
        out = run()
        if op in ("get_fill", "set", "apply", "scan"):
            assert out.shape == leaf_shape
        return
    error = raises_unchanged(ValueError, run, tree, mask)
    text = str(error)
    assert "tree['p']['w']" in text
    assert str(mask_shape) in text and str(leaf_shape) in text


def test_an_element_mask_from_a_where_predicate_must_fit_its_leaf():
    tree = {"a": jnp.ones((2, 3)), "b": jnp.ones(3)}
    wrong = tc.where(lambda path, node: jnp.ones(2, bool) if path[-1].key == "a" else False)
    error = raises_unchanged(ValueError, lambda: tc.at(tree)[wrong].set(0.0), tree)
    assert "tree['a']" in str(error) and "(2,)" in str(error) and "(2, 3)" in str(error)


def test_an_element_mask_over_a_subtree_names_the_leaf_that_does_not_fit():
    tree = {"x": {"a": jnp.ones(2), "b": jnp.ones(3)}}
    mask = {"x": jnp.ones(2, bool)}
    error = raises_unchanged(ValueError, lambda: tc.at(tree)[mask].apply(jnp.negative), tree)
    assert "tree['x']['b']" in str(error)


def test_an_apply_result_that_would_grow_the_leaf_under_an_element_mask_is_an_error():
    tree = {"a": jnp.ones(3)}
    mask = {"a": jnp.array([True, False, True])}
    error = raises_unchanged(
        ValueError, lambda: tc.at(tree)[mask].apply(lambda x: jnp.ones((2, 3))), tree
    )
    assert "tree['a']" in str(error)


_leaf_shapes = st.sampled_from([(), (3,), (2, 3)])


@st.composite
def _arrays_and_masks(draw):
    names = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True))
    tree, mask = {}, {}
    for name in names:
        shape = draw(_leaf_shapes)
        size = math.prod(shape)
        values = draw(st.lists(st.floats(-5, 5, width=32), min_size=size, max_size=size))
        tree[name] = jnp.asarray(values, jnp.float32).reshape(shape)
        kind = draw(st.sampled_from(["bool", "array", "row"]))
        if kind == "bool" or not shape:
            mask[name] = draw(st.booleans())
        else:
            mask_shape = shape if kind == "array" else (1,) * (len(shape) - 1) + shape[-1:]
            flags = draw(
                st.lists(
                    st.booleans(), min_size=math.prod(mask_shape), max_size=math.prod(mask_shape)
                )
            )
            mask[name] = jnp.asarray(flags).reshape(mask_shape)
    return tree, mask


@settings(**{**SETTINGS, "max_examples": 25})
@given(pair=_arrays_and_masks(), value=st.floats(-3, 3, width=32))
def test_at_mask_set_apply_get_equal_a_tree_map_where_reference(pair, value):
    tree, mask = pair
    before = snapshot(tree)
    value = np.float32(value)

    # a bool selects the whole leaf (a number set there fills the array, which keeps its
    # shape and dtype); a boolean array selects elements (`jnp.where`, the same shape)
    def where(m, new, x):
        if m is True:
            return jnp.full_like(x, new) if isinstance(new, np.float32) else new
        return x if m is False else jnp.where(m, new, x)

    got = tc.at(tree)[mask].set(value)
    for k in tree:
        want = where(mask[k], value, tree[k])
        assert bool(jnp.array_equal(got[k], want)) and jnp.shape(got[k]) == jnp.shape(want)
    got = tc.at(tree)[mask].apply(lambda x: x * 2 + 1)
    for k in tree:
        want = where(mask[k], tree[k] * 2 + 1, tree[k])
        assert bool(jnp.array_equal(got[k], want)) and got[k].shape == tree[k].shape
    got = tc.at(tree)[mask].get(fill_value=0.0)
    for k in tree:  # a bool keeps or fills the whole leaf; an array fills elements
        m = mask[k]
        want = tree[k] if m is True else 0.0 if m is False else jnp.where(m, tree[k], 0.0)
        assert bool(jnp.array_equal(got[k], want)) and jnp.shape(got[k]) == jnp.shape(want)
    total = tc.at(tree)[mask].reduce(lambda a, x: a + jnp.sum(x), initializer=0.0)
    expected = sum(float(jnp.sum(jnp.where(mask[k], tree[k], 0.0))) for k in tree)
    assert float(total) == pytest.approx(expected, abs=1e-4)
    selected = tc.at(tree)[mask].get()
    for k in tree:
        m = mask[k]
        if m is True:
            assert selected[k] is tree[k]
        elif m is False:
            assert selected[k] is None
        else:
            assert selected[k].tolist() == tree[k][jnp.broadcast_to(m, tree[k].shape)].tolist()
    assert_unchanged(tree, before)


# ================================================================================================
# Rule 6: what you read is what JAX sees
# ================================================================================================


def _twice(v: Any) -> Any:
    return v * 2


class Declared(tc.TreeClass):
    a: Any
    s: Any = tc.field(default=3, static=True)
    g: Any = tc.field(default=2.0, on_getattr=[_twice])
    K = 5

    def method(self):
        return 1


class Written(tc.TreeClass):
    def __init__(self):
        self.a = 1.0
        self.b = np.ones(2)

    def method(self):
        return 1

    def poke(self):
        self.b[0] = -1.0
        return "poked"


class DeclaredTwin(tc.TreeClass):
    a: Any
    s: Any = tc.field(default=3, static=True)
    g: Any = tc.field(default=2.0, on_getattr=[_twice])


FACTORIES = {"declared": lambda: Declared(1.0), "written": Written}
NAMES = ["a", "b", "s", "g", "K", "method", "new", "_private", "__dunder__", "prop"]
_ABSENT = object()

ROUTES = {
    "setattr": lambda o, k, v: setattr(o, k, v),
    "delattr": lambda o, k, v: delattr(o, k),
    "dict_setitem": lambda o, k, v: o.__dict__.__setitem__(k, v),
    "vars_setitem": lambda o, k, v: vars(o).__setitem__(k, v),
    "vars_update": lambda o, k, v: vars(o).update({k: v}),
    "vars_delitem": lambda o, k, v: vars(o).__delitem__(k),
    "object_setattr": lambda o, k, v: object.__setattr__(o, k, v),
    "object_delattr": lambda o, k, v: object.__delattr__(o, k),
    "object_set_dict": lambda o, k, v: object.__setattr__(o, "__dict__", {k: v}),
    "set_dict": lambda o, k, v: setattr(o, "__dict__", {**vars(o), k: v}),
    "del_dict": lambda o, k, v: object.__delattr__(o, "__dict__"),
    "setstate": lambda o, k, v: o.__setstate__({k: v}),
    "reinit": lambda o, k, v: o.__init__(v) if isinstance(o, Declared) else o.__init__(),
}


def _read(obj: Any, name: str) -> Any:
    try:
        value = getattr(obj, name)
    except AttributeError:
        return _ABSENT
    if inspect.ismethod(value):
        return ("method", value.__func__)
    return value


def _same_read(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, tuple) and a[:1] == ("method",):
        return a == b
    return same_leaf(a, b)


def assert_reads_match_flatten(obj: Any, names: list[str]) -> None:
    """Every attribute read of `obj` equals the read of its flatten/unflatten copy."""
    rebuilt = jax.tree_util.tree_map(lambda x: x, obj)
    assert type(rebuilt) is type(obj)
    assert list(vars(rebuilt)) == list(vars(obj))
    for name in set(names) | set(vars(obj)):
        assert _same_read(_read(obj, name), _read(rebuilt, name)), name
    leaves = jax.tree_util.tree_leaves(obj)
    statics = set(n for n in vars(obj) if n == "s" and isinstance(obj, Declared))
    stored = [v for n, v in vars(obj).items() if n not in statics]
    assert len(leaves) == len(stored)
    assert all(same_leaf(x, y) for x, y in zip(leaves, stored))


def _unknown_to_the_class(obj: Any, name: str) -> bool:
    """A name no instance of the class has had: no guard exists for it.

    `object.__setattr__` of such a name on a sealed instance cannot be refused (Python
    calls no hook of the class for it); treeclass documents that it makes a plain
    attribute outside the tree. Every other route, and every known name, is refused.
    """
    return not isinstance(inspect.getattr_static(type(obj), name, None), _node.GUARDS)


def assert_children_match_flatten(obj: Any) -> None:
    """JAX's view equals the reads of the instance's children (its layout's names)."""
    names = _node.child_names(obj)
    leaves = jax.tree_util.tree_leaves(obj)
    assert len(leaves) == len(names)
    stored = vars(obj)  # the stored values: `on_getattr` fields read transformed
    assert all(same_leaf(x, stored[n]) for x, n in zip(leaves, names, strict=True))


@pytest.mark.parametrize("route", sorted(ROUTES))
@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    factory=st.sampled_from(sorted(FACTORIES)),
    name=st.sampled_from(NAMES),
    value=st.one_of(
        st.floats(allow_nan=False), st.text(max_size=3), st.just(np.zeros(2)), st.just(jnp.ones(3))
    ),
)
def test_every_escape_hatch_write_raises_or_is_seen_by_flatten(route, factory, name, value):
    obj = FACTORIES[factory]()
    before = snapshot(obj)
    unknown = route == "object_setattr" and _unknown_to_the_class(obj, name)
    try:
        ROUTES[route](obj, name, value)
    except (AttributeError, TypeError):
        assert_unchanged(obj, before)
    if unknown:
        assert_tree_unchanged(obj, before)  # the tree is as it was; the name is not a child
        assert_children_match_flatten(obj)
        return
    assert_reads_match_flatten(obj, NAMES)


@pytest.mark.parametrize("name", ["new", "_private", "__dunder__", "method", "K"])
@pytest.mark.parametrize("factory", sorted(FACTORIES))
def test_object_setattr_of_a_name_the_class_never_had_leaves_the_tree_as_it_was(factory, name):
    obj = FACTORIES[factory]()
    before = snapshot(obj)
    object.__setattr__(obj, name, 7.0)  # documented: cannot be refused, not a child
    assert_tree_unchanged(obj, before)
    assert_children_match_flatten(obj)
    out = jax.jit(lambda t: t)(obj)  # leaves come back as arrays: compare by value
    assert jax.tree_util.tree_structure(out) == before[0]
    for got, want in zip(
        jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(obj), strict=True
    ):  # values only: jit makes f64 NumPy leaves f32
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert _read(out, name) != 7.0  # the extra attribute is not part of the tree


@pytest.mark.parametrize(
    ("factory", "name"),
    [
        ("declared", "a"),
        ("declared", "s"),
        ("declared", "g"),
        ("written", "a"),
        ("written", "b"),
    ],
)
def test_object_setattr_of_a_known_name_is_refused(factory, name):
    obj = FACTORIES[factory]()
    assert not _unknown_to_the_class(obj, name)
    before = snapshot(obj)
    with pytest.raises(AttributeError, match="immutable"):
        object.__setattr__(obj, name, 7.0)
    with pytest.raises(AttributeError, match="immutable"):
        object.__delattr__(obj, name)
    assert_unchanged(obj, before)
    assert_reads_match_flatten(obj, NAMES)


@pytest.mark.parametrize("when", ["init", "method"])
def test_a_dict_reference_taken_while_unsealed_cannot_change_a_sealed_instance(when):
    leaked = []

    class Leaky(tc.TreeClass):
        def __init__(self, a):
            self.a = a
            if when == "init":
                leaked.append(vars(self))

        def leak(self):
            leaked.append(vars(self))

    obj = Leaky(1.0)
    if when == "method":
        _, obj = obj.at["leak"]()
    before = snapshot(obj)
    try:
        leaked[0]["a"] = 5.0
        leaked[0]["extra"] = 6.0
    except TypeError:
        pass
    assert obj.a == jax.tree_util.tree_leaves(obj)[0]
    assert_reads_match_flatten(obj, ["a", "extra"])
    assert_unchanged(obj, before)


@pytest.mark.parametrize("method", ["__setattr__", "__delattr__"])
def test_setattr_or_delattr_in_a_class_body_is_a_type_error_at_class_creation(method):
    with pytest.raises(TypeError, match=method):
        type("Bad", (tc.TreeClass,), {method: lambda self, *a: None})


def test_setattr_inherited_from_a_mixin_is_refused_or_its_writes_are_seen_by_flatten():
    class Logging:  # a plain mixin ahead of TreeClass in the MRO
        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)

    try:

        class Model(Logging, tc.TreeClass):
            a: Any
    except TypeError as error:
        assert "__setattr__" in str(error)
        return
    obj = Model(1.0)
    for name in ("a", "new"):
        try:
            setattr(obj, name, 5.0)
        except AttributeError:
            pass
        assert_reads_match_flatten(obj, ["a", "new"])


def test_at_method_writing_into_a_numpy_leaf_leaves_the_input_intact():
    obj = Written()
    before = snapshot(obj)
    value, new = obj.at["poke"]()
    assert value == "poked"
    assert obj.b.tolist() == [1.0, 1.0]
    assert new.b.tolist() == [-1.0, 1.0]
    assert_unchanged(obj, before)


def test_at_method_on_a_nested_node_writing_numpy_buffers_leaves_the_input_intact():
    class Holder(tc.TreeClass):
        child: Any
        table: Any

        def fill(self):
            self.table["w"][:] = 0.0
            self.child.b[1] = 5.0

    obj = Holder(Written(), {"w": np.ones(3)})
    before = snapshot(obj)
    _, new = obj.at["fill"]()
    assert obj.table["w"].tolist() == [1.0, 1.0, 1.0] and obj.child.b.tolist() == [1.0, 1.0]
    assert new.table["w"].tolist() == [0.0, 0.0, 0.0] and new.child.b.tolist() == [1.0, 5.0]
    assert_unchanged(obj, before)
    _, newer = obj.at["child"]["poke"]()
    assert obj.child.b.tolist() == [1.0, 1.0] and newer.child.b.tolist() == [-1.0, 1.0]
    assert_unchanged(obj, before)


def test_at_method_that_raises_leaves_the_input_intact():
    class Breaks(tc.TreeClass):
        def __init__(self):
            self.b = np.ones(2)

        def go(self):
            self.b[0] = -3.0
            self.extra = 1
            raise RuntimeError("halfway")

    obj = Breaks()
    raises_unchanged(RuntimeError, lambda: obj.at["go"](), obj)
    assert obj.b.tolist() == [1.0, 1.0]


# ================================================================================================
# Rule 7: concurrency is exact
# ================================================================================================


def _layout(tree: Any) -> Any:
    """The auxiliary data JAX gets for the root of `tree` (a TreeClass: its layout)."""
    return jax.tree_util.tree_structure(tree).node_data()[1]


@pytest.mark.parametrize("cls", [Tagged, HandTagged])
@pytest.mark.parametrize("kind", ["plain", "keyed"])
def test_equal_statics_built_on_many_threads_share_one_layout_and_one_trace(cls, kind):
    threads, per_thread = 16, 12
    token = uuid.uuid4().hex  # static values no earlier test has built
    barrier = threading.Barrier(threads)

    def static(k: int) -> Any:
        if kind == "plain":  # a str: its layout may be looked up on first flatten
            return f"{token}-{k}"
        return (token, k, -0.0, np.float32(k))

    def build(_):
        barrier.wait()
        return [cls(jnp.ones(()), static(k)) for k in range(per_thread)]

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        built = list(pool.map(build, range(threads)))
    for k in range(per_thread):
        column = [row[k] for row in built]
        assert len({id(_layout(t)) for t in column}) == 1
        assert all(t._tc_layout is _layout(column[0]) for t in column)
    f, log = traced(lambda t: t.x * 2)
    for row in built:
        for tree in row:
            f(tree)
    assert len(log) == per_thread


@pytest.mark.parametrize("cls", [Tagged, HandTagged])
def test_instances_built_on_one_thread_and_flattened_on_many_share_one_layout(cls):
    threads = 16
    token = uuid.uuid4().hex
    trees = [cls(jnp.ones(()), f"{token}-{k % 5}") for k in range(threads * 10)]
    barrier = threading.Barrier(threads)

    def flatten(i):
        barrier.wait()
        return [id(_layout(t)) for t in trees[i::threads]] + [id(_layout(t)) for t in trees]

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(flatten, range(threads)))
    for k in range(5):
        same = [t for t in trees if t.tag == f"{token}-{k}"]
        assert len({id(_layout(t)) for t in same}) == 1
        assert len({id(t._tc_layout) for t in same}) == 1


def test_at_with_a_glob_on_many_threads_gives_the_same_result():
    tree = {f"layer{i}": {"weight": float(i), "bias": 0.0} for i in range(8)}
    expected = tc.at(tree)[tc.glob("*.weight")].apply(lambda x: -x)

    def run(_):
        return [tc.at(tree)[tc.glob("*.weight")].apply(lambda x: -x) for _ in range(20)]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for results in pool.map(run, range(8)):
            assert all(r == expected for r in results)


# ================================================================================================
# Rule 8: errors name the path and the argument
# ================================================================================================


def _fails_at_negative(x):
    if jnp.any(jnp.asarray(x) < 0):
        raise ZeroDivisionError("negative leaf")
    return x


WHERE = ".layers[1].bias"  # the prefix (`Net`) is rule 9's


def _user_fn_entry_points():
    net_mask_all = lambda net: jax.tree_util.tree_map(lambda _: True, net)
    net_mask_arrays = lambda net: jax.tree_util.tree_map(lambda x: x < 10, net)
    return {
        "apply": lambda net: net.at[...].apply(_fails_at_negative),
        "apply_path": lambda net: net.at["layers"][1].apply(_fails_at_negative),
        "apply_parallel": lambda net: net.at[...].apply(_fails_at_negative, is_parallel=True),
        "scan": lambda net: net.at[...].scan(lambda x, s: (_fails_at_negative(x), s), 0),
        "reduce": lambda net: net.at[...].reduce(lambda a, x: _fails_at_negative(x), initializer=0),
        "mask_apply": lambda net: net.at[net_mask_all(net)].apply(_fails_at_negative),
        "element_mask_apply": lambda net: net.at[net_mask_arrays(net)].apply(_fails_at_negative),
        "prefix_mask_apply": lambda net: net.at[Net(True)].apply(_fails_at_negative),
        "set_where": lambda net: net.at[
            tc.where(lambda p, n: isinstance(n, jax.Array) and _fails_at_negative(n) is None)
        ].set(0.0),
        "get_where": lambda net: net.at["layers"][
            tc.where(lambda p, n: isinstance(n, jax.Array) and _fails_at_negative(n) is None)
        ].get(),
        "tree_mask": lambda net: tc.tree_mask(net, lambda x: _fails_at_negative(x) is None),
        "tree_unmask": lambda net: tc.tree_unmask(
            tc.tree_mask(net, lambda x: True), lambda x: _fails_at_negative(x) is None
        ),
        "bcmap": lambda net: tc.bcmap(_fails_at_negative)(net),
        "tree_map_with_trace": lambda net: tc.tree_map_with_trace(
            lambda trace, x: _fails_at_negative(x), net
        ),
    }


@pytest.mark.parametrize("entry", sorted(_user_fn_entry_points()))
def test_a_user_function_error_keeps_its_type_and_gets_a_note_naming_the_leaf(entry):
    net = make_net()
    error = raises_unchanged(ZeroDivisionError, lambda: _user_fn_entry_points()[entry](net), net)
    assert str(error) == "negative leaf"
    assert any(WHERE in note for note in notes(error)), notes(error)


def test_a_scan_function_error_gets_one_note_naming_the_user_function():
    net = make_net()

    def step(x, s):
        return _fails_at_negative(x), s

    error = raises_unchanged(ZeroDivisionError, lambda: net.at[...].scan(step, 0), net)
    naming = [n for n in notes(error) if WHERE in n]
    assert len(naming) == 1, notes(error)
    assert "step" in naming[0] and "_Scan" not in naming[0]


@pytest.mark.parametrize("op", ["get", "set", "apply", "reduce", "scan"])
@pytest.mark.parametrize("bad", [3, "fn", None])
def test_non_callables_as_fn_or_is_leaf_are_type_errors(op, bad):
    tree = _layers_tree()
    indexer = tc.at(tree)[...]
    if op in ("apply", "reduce", "scan") and bad is not None:
        run = {
            "apply": lambda: indexer.apply(bad),
            "reduce": lambda: indexer.reduce(bad),
            "scan": lambda: indexer.scan(bad, 0),
        }[op]
        error = raises_unchanged(TypeError, run, tree)
        assert "fn" in str(error) and type(bad).__name__ in str(error)
    if bad is None:
        return
    run = {
        "get": lambda: indexer.get(is_leaf=bad),
        "set": lambda: indexer.set(0, is_leaf=bad),
        "apply": lambda: indexer.apply(abs, is_leaf=bad),
        "reduce": lambda: indexer.reduce(max, is_leaf=bad),
        "scan": lambda: indexer.scan(lambda x, s: (x, s), 0, is_leaf=bad),
    }[op]
    error = raises_unchanged(TypeError, run, tree)
    assert "is_leaf" in str(error)


@pytest.mark.parametrize("entry", ["tree_mask", "bcmap", "tree_map_with_trace", "where"])
def test_non_callables_in_other_entry_points_are_type_errors_naming_the_argument(entry):
    tree = _layers_tree()
    run = {
        "tree_mask": lambda: tc.tree_mask(tree, is_leaf=3),
        "bcmap": lambda: tc.bcmap(abs, is_leaf=3)(tree),
        "tree_map_with_trace": lambda: tc.tree_map_with_trace(3, tree),
        "where": lambda: tc.where(3),
    }[entry]
    error = raises_unchanged(TypeError, run, tree)
    assert re.search(r"is_leaf|func|fn|callable", str(error)), str(error)
    assert "incompatible function arguments" not in str(error)
    assert str(error) != "'int' object is not callable"


@pytest.mark.parametrize("result", [1.0, (1.0,), (1.0, 2.0, 3.0), [1.0, 0]])
def test_a_scan_function_not_returning_a_pair_is_a_type_error_naming_the_path(result):
    net = make_net()
    error = raises_unchanged(TypeError, lambda: net.at[...].scan(lambda x, s: result, 0), net)
    assert "Net.layers[0].weight" in str(error) and "pair" in str(error)


def _big_mask_with_one_bad_leaf(bad: Any) -> tuple[dict, dict]:
    tree = {f"k{i:03d}": float(i) for i in range(300)}
    mask = {k: True for k in tree}
    mask["k150"] = bad
    return tree, mask


@pytest.mark.parametrize("bad", [1, "yes", 1.0, np.int32(1), jnp.array(1)])
@pytest.mark.parametrize("entry", ["get", "set", "apply", "tree_mask", "optim_mask", "check_mask"])
def test_a_mask_with_a_non_bool_leaf_names_that_leaf_and_not_the_whole_mask(bad, entry):
    tree, mask = _big_mask_with_one_bad_leaf(bad)
    run = {
        "get": lambda: tc.at(tree)[mask].get(),
        "set": lambda: tc.at(tree)[mask].set(0.0),
        "apply": lambda: tc.at(tree)[mask].apply(abs),
        "tree_mask": lambda: tc.tree_mask(tree, mask),
        "optim_mask": lambda: tc.optim.mask(tree, mask),
        "check_mask": lambda: tc.optim.check_mask(mask, tree),
    }[entry]
    error = raises_unchanged((TypeError, ValueError), run, tree, mask)
    text = str(error)
    assert "tree['k150']" in text
    assert "k299" not in text and len(text) < 800


@pytest.mark.parametrize(
    "kwargs",
    [{"init": 1}, {"static": "yes"}, {"repr": None}, {"static": np.bool_(True)}, {"init": 0}],
)
def test_non_bool_field_flags_are_type_errors(kwargs):
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        tc.field(**kwargs)


@pytest.mark.parametrize("alias", ["class", "def", "None", "a b", "1x", ""])
def test_field_alias_that_cannot_be_a_parameter_is_a_value_error(alias):
    with pytest.raises(ValueError, match="alias"):
        tc.field(alias=alias)


@pytest.mark.parametrize("name", ["_tc_x", "_tc_layout", "at", "self"])
def test_fields_named_like_internals_are_value_errors_at_class_creation(name):
    with pytest.raises(ValueError, match=name):
        type("Bad", (tc.TreeClass,), {"__annotations__": {name: int}, "__module__": __name__})


@pytest.mark.parametrize("name", ["class", "lambda", "None", "a-b", "1x"])
@pytest.mark.parametrize("kind", ["treeclass", "autoinit"])
def test_a_field_name_that_cannot_be_a_parameter_is_refused_without_a_syntax_error(name, kind):
    namespace = {"__annotations__": {name: int}, "__module__": __name__}
    try:
        if kind == "treeclass":
            cls = type("Odd", (tc.TreeClass,), namespace)
        else:
            cls = tc.autoinit(type("Odd", (), namespace))
    except (TypeError, ValueError) as error:
        assert not isinstance(error, SyntaxError)
        assert repr(name) in str(error) or f"`{name}`" in str(error)
        return
    obj = cls(**{name: 1}) if name.isidentifier() else cls(1)
    assert getattr(obj, name) == 1


@pytest.mark.parametrize(
    "name", ["__tc_missing", "__tc_node", "__tc_default_b", "__dict__", "__class__", "__init__"]
)
def test_a_field_named_like_generated_code_internals_is_refused_or_works(name):
    namespace = {
        "__annotations__": {name: int, "b": list},
        "__module__": __name__,
        "b": tc.field(factory=lambda: [1, 2]),
    }
    try:
        cls = type("Odd", (tc.TreeClass,), namespace)
    except (TypeError, ValueError) as error:
        assert name in str(error) and "field" in str(error).lower()
        return
    obj = cls(5)
    assert vars(obj) == {name: 5, "b": [1, 2]}


@pytest.mark.parametrize("alias", ["__tc_missing", "__tc_node", "__tc_dict_type"])
def test_an_alias_named_like_generated_code_internals_is_refused_or_works(alias):
    try:

        class Odd(tc.TreeClass):
            a: int = tc.field(alias=alias)
            b: list = tc.field(factory=lambda: [1, 2])
    except (TypeError, ValueError) as error:
        assert alias in str(error)
        return
    obj = Odd(**{alias: 5})
    assert vars(obj) == {"a": 5, "b": [1, 2]}


@pytest.mark.parametrize("selections", [3, [("w", "w")], "w", None])
def test_optim_labels_with_a_non_mapping_is_a_type_error(selections):
    tree = {"w": jnp.ones(2)}
    raises_unchanged(TypeError, lambda: tc.optim.labels(tree, selections), tree)


# ================================================================================================
# Rule 9: one way to walk a node, one path prefix
# ================================================================================================


def test_tree_mask_blames_the_namedtuple_field_that_does_not_fit():
    tree, mask = Point(1.0, 2.0), Point(True, {"x": True})
    error = raises_unchanged(ValueError, lambda: tc.tree_mask(tree, mask), tree, mask)
    assert "Point.b" in str(error) and "Point.a" not in str(error)


def _mismatches():
    tree = {"a": [1.0, 2.0], "b": 3.0}
    net = Net([Linear(1.0, 2.0), Linear(3.0, 4.0)])
    return [
        (Point(1.0, 2.0), Point(True, {"x": True}), "Point.b"),
        (tree, {"a": [True], "b": True}, "tree['a']"),
        (tree, {"a": [True, {"y": False}], "b": True}, "tree['a'][1]"),
        (net, Net([Linear(True, True), {"weight": True, "bias": False}]), "Net.layers[1]"),
        (net, Net([Linear(True, True), [True]]), "Net.layers[1]"),
        ([(1.0, 2.0)], [[True, True]], "tree[0]"),
    ]


@pytest.mark.parametrize("tree, mask, where", _mismatches())
def test_every_mask_entry_point_names_the_same_key_path(tree, mask, where):
    runs = {
        "at": lambda: tc.at(tree)[mask].get(),
        "tree_mask": lambda: tc.tree_mask(tree, mask),
        "check_mask": lambda: tc.optim.check_mask(mask, tree),
        "optim_mask": lambda: tc.optim.mask(tree, mask),
    }
    for name, run in runs.items():
        error = raises_unchanged(ValueError, run, tree, mask)
        text = str(error)
        found = re.findall(r"(?:tree|Point|Net)(?:\.\w+|\[[^\]]*\])*", text)
        assert where in found, (name, text)
        deeper = [p for p in found if p.startswith(where) and p != where and len(p) > len(where)]
        assert not deeper, (name, text)


def test_every_mask_entry_point_describes_the_mismatch_the_same_way():
    tree = {"a": [1.0, 2.0], "b": 3.0}
    mask = {"a": [True], "b": True}
    texts = []
    for run in (
        lambda: tc.at(tree)[mask].get(),
        lambda: tc.tree_mask(tree, mask),
        lambda: tc.optim.check_mask(mask, tree),
    ):
        texts.append(str(raises_unchanged(ValueError, run, tree, mask)))
    for text in texts:
        assert "`list` with children (0, 1)" in text and "`list` with children (0)" in text
        assert "missing in the mask: [1]" in text, text


@pytest.mark.parametrize("entry", ["at", "tree_mask", "bcmap", "tree_map_with_trace", "leafwise"])
def test_user_function_notes_use_the_root_class_name_as_the_path_prefix(entry):
    class Pairs(tc.TreeClass, leafwise=True):
        a: Any
        b: Any

    def bad(x, *rest):
        if x.shape == (3,):
            raise KeyError("boom")
        return x

    tree = Pairs(jnp.ones(2), jnp.ones(3))
    run = {
        "at": lambda: tree.at[...].apply(bad),
        "tree_mask": lambda: tc.tree_mask(tree, lambda x: bad(x) is None),
        "bcmap": lambda: tc.bcmap(bad)(tree),
        "tree_map_with_trace": lambda: tc.tree_map_with_trace(lambda tr, x: bad(x), tree),
        "leafwise": lambda: tree + Pairs(jnp.ones(2), jnp.ones(4)),
    }[entry]
    error = raises_unchanged(Exception, run, tree)
    assert any("Pairs.b" in n for n in notes(error)), notes(error)
    assert not any("tree.b" in n for n in notes(error)), notes(error)


def test_builtin_roots_are_named_tree_everywhere():
    tree = {"a": {"b": 1.0}}
    for run in (
        lambda: tc.at(tree)["a"]["c"].get(),
        lambda: tc.at(tree)[{"a": {"b": 3}}].get(),
        lambda: tc.tree_mask(tree, {"a": [True]}),
        lambda: tc.optim.check_mask({"a": [True]}, tree),
    ):
        error = raises_unchanged((LookupError, ValueError, TypeError), run, tree)
        assert "tree['a']" in str(error), str(error)


# ================================================================================================
# Rule 10: the docs do not lead into traps
# ================================================================================================


class Embed(tc.TreeClass):
    table: Any


class Model(tc.TreeClass):
    embed: Embed
    head: Any
    steps: Any = 0
    act: Any = tc.freeze(jax.nn.relu)

    def __call__(self, x):
        return tc.unfreeze(self.act)(x @ tc.unfreeze(self.embed).table) * self.head


def _model() -> Model:
    return Model(Embed(jnp.ones((3, 2))), jnp.ones(2))


def test_setting_a_frozen_subtree_over_a_node_replaces_the_node_and_jit_works():
    model = _model()
    before = snapshot(model)
    frozen = model.at["embed"].set(tc.freeze(model.embed))
    assert tc.is_frozen(frozen.embed)
    assert tc.is_tree_equal(tc.unfreeze(frozen.embed), model.embed)
    assert len(jax.tree_util.tree_leaves(frozen)) == 2  # `head` and `steps`
    assert_unchanged(model, before)
    out = jax.jit(lambda m, x: m(x))(frozen, jnp.ones(3))
    assert out.tolist() == model(jnp.ones(3)).tolist()
    grads = jax.jit(jax.grad(lambda m: m(jnp.ones(3)).sum(), allow_int=True))(frozen)
    assert tc.is_frozen(grads.embed)
    back = frozen.at["embed"].apply(tc.unfreeze, is_leaf=tc.is_frozen)
    assert tc.is_tree_equal(back, model)


def test_setting_a_frozen_subtree_over_a_dict_node_replaces_it():
    tree = {"e": {"a": 1.0, "b": 2.0}, "h": 1.0}
    out = tc.at(tree)["e"].set(tc.freeze(tree["e"]))
    assert tc.is_frozen(out["e"]) and tc.unfreeze(out["e"]) == {"a": 1.0, "b": 2.0}
    assert jax.jit(lambda t: t["h"] * 2)(out) == 2.0


def test_unmask_with_the_mask_given_to_tree_mask_keeps_what_the_class_froze():
    model = _model()
    mask = jax.tree_util.tree_map(lambda x: isinstance(x, int), model)
    masked = tc.tree_mask(model, mask)
    assert tc.is_frozen(masked.steps)
    thawed = tc.tree_unmask(masked, mask)
    assert not tc.is_frozen(thawed.steps) and tc.is_frozen(thawed.act)
    assert tc.is_tree_equal(thawed, model)
    jax.jit(lambda m: m)(thawed)  # a bare function leaf would fail here


def test_unmask_without_a_mask_thaws_a_class_frozen_value_as_documented():
    model = _model()
    thawed = tc.tree_unmask(tc.tree_mask(model))
    assert not tc.is_frozen(thawed.act)
    with pytest.raises(TypeError):
        jax.jit(lambda m: m)(thawed)
