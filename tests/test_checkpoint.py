"""Tests for treeclass._checkpoint: state_dict / from_state_dict, save / load.

The many-device and orbax checks run in a subprocess (tests/checkpoint_multidevice_check.py)
with 8 simulated CPU devices; the pickle and cloudpickle checks run in fresh interpreters.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile
import textwrap
import tracemalloc
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import device_holds, device_keeps_zero_sign, needs_read_counts
from hypothesis import given, settings
from hypothesis import strategies as st
from multidevice import run_check_script

import treeclass as tc

# a non-strict load that kept values the file holds under another name warns; expected
LOSSY = pytest.mark.filterwarnings("ignore:.*under another name, dtype or layout:UserWarning")

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    act: Any = tc.freeze(jax.nn.relu)
    name: str = tc.field(default="linear", static=True)


class MLP(tc.TreeClass):
    def __init__(self, sizes: list[int], seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.layers = tuple(
            Linear(
                jnp.asarray(rng.normal(size=(i, o)), jnp.float32),
                jnp.zeros(o) + seed,
                name=f"layer{n}",
            )
            for n, (i, o) in enumerate(zip(sizes[:-1], sizes[1:]))
        )
        self.embed = tc.freeze(jnp.asarray(rng.normal(size=(5, sizes[0])), jnp.float32))
        self.kind = tc.freeze("mlp")
        self.step = seed
        self.scale = 0.5 + seed


class Pair(NamedTuple):
    first: Any
    second: Any


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def _bytes(x: Any) -> bytes:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x).tobytes()


def _leaves(tree: Any) -> list:
    return [tc.unfreeze(x) for x in jax.tree_util.tree_leaves(tree, is_leaf=tc.is_frozen)]


def assert_same(a: Any, b: Any) -> None:
    """Same structure, frozen values and static fields; leaves of the same type, bit for bit."""
    leaves_a, def_a = jax.tree_util.tree_flatten(a, is_leaf=tc.is_frozen)
    leaves_b, def_b = jax.tree_util.tree_flatten(b, is_leaf=tc.is_frozen)
    assert def_a == def_b, (def_a, def_b)
    for x, y in zip(leaves_a, leaves_b):
        if tc.is_frozen(x):
            assert tc.is_frozen(y)
            assert_same(tc.unfreeze(x), tc.unfreeze(y))
        elif isinstance(x, (jax.Array, np.ndarray, np.generic)):
            assert type(x) is type(y), (type(x), type(y))
            assert x.dtype == y.dtype and x.shape == y.shape, (x, y)
            assert _bytes(x) == _bytes(y), (x, y)
        elif isinstance(x, float) and x != x:
            assert isinstance(y, float) and y != y
        else:
            assert type(x) is type(y) and (x is y or x == y), (x, y)


def round_trip(tree: Any, like: Any = None, **kwargs: Any) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "tree.safetensors")
        tc.save(path, tree)
        return tc.load(path, tree if like is None else like, **kwargs)


def read_header(path: pathlib.Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def write_header(path: pathlib.Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def random_array(dtype: Any, shape: tuple, seed: int = 0) -> np.ndarray:
    """Every bit pattern is fair game (NaN payloads too), except where the dtype has
    fewer bits than its byte (bools, 4-bit and 2-bit types)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.name in ("int4", "uint4", "int2", "uint2", "float4_e2m1fn"):
        info = ml_dtypes.iinfo(dtype) if "int" in dtype.name else None
        if info is not None:
            return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)
        return rng.choice([0.0, 0.5, 1.0, -1.5, 6.0, -6.0], shape).astype(dtype)
    return np.frombuffer(rng.bytes(count * dtype.itemsize), dtype).reshape(shape).copy()


STANDARD_DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "float8_e4m3fn",
    "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
]  # fmt: skip
# no safetensors name: stored as raw bytes
RAW_DTYPES = [
    "complex128",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float4_e2m1fn",
    "int4",
    "uint4",
    "int2",
    "uint2",
]
ALL_DTYPES = STANDARD_DTYPES + RAW_DTYPES
SHAPES = [(), (0,), (3, 0), (2, 3)]


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(getattr(ml_dtypes, name))


# ------------------------------------------------------------------------------------------
# round trips
# ------------------------------------------------------------------------------------------


def _unsigned_zeros(value):
    """`value` with every zero, of each part of a complex number alone, made +0.0."""
    out = np.array(value, copy=True)
    parts = (out.real, out.imag) if np.iscomplexobj(out) else (out,)
    for part in parts:
        part[part == 0] = 0  # a view: writes into `out`; other bits (NaN payloads) kept
    return out[()]


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_every_dtype_round_trips_bit_exactly_as_numpy_and_jax_arrays(name):
    dtype = _dtype(name)
    numpy_tree = {f"s{i}": random_array(dtype, shape, i) for i, shape in enumerate(SHAPES)}
    numpy_tree["scalar"] = random_array(dtype, (1,), 9)[0]  # a numpy scalar
    assert_same(round_trip(numpy_tree), numpy_tree)
    if not device_holds(dtype):  # (putting one on this backend's device ends the process)
        return
    with jax.enable_x64(True):  # 64-bit dtypes exist in jax only with x64
        jax_tree = {key: jnp.asarray(value) for key, value in numpy_tree.items()}
        if not device_keeps_zero_sign(dtype):
            # a TPU places an exact -0.0 as +0.0, yet gives -0.0 back for a tiny negative
            # number it flushed: compare against zeros it can place (the file keeps the sign)
            jax_tree = {k: jnp.asarray(_unsigned_zeros(np.asarray(v))) for k, v in jax_tree.items()}
        assert_same(round_trip(jax_tree), jax_tree)


@pytest.mark.parametrize("name", ["float32", "int64", "float16", "complex128", "uint16"])
def test_big_endian_numpy_arrays_are_saved_little_endian_and_restored(tmp_path, name):
    from safetensors.numpy import load_file

    big = np.dtype(name).newbyteorder(">")
    tree = {"a": random_array(name, (2, 3)).astype(big), "f": tc.freeze(np.arange(2, dtype=big))}
    path = tmp_path / "m.safetensors"
    tc.save(path, tree)
    restored = tc.load(path, tree)
    for got, want in zip(_leaves(restored), _leaves(tree)):
        assert got.dtype == big and got.tobytes() == want.tobytes()
    if name != "complex128":  # a dtype safetensors names: other readers see the values
        assert np.array_equal(load_file(str(path))["a"], tree["a"], equal_nan=True)


def test_file_tensors_carry_safetensors_dtype_names(tmp_path):
    path = tmp_path / "tree.safetensors"
    tree = {
        name: np.zeros(2, _dtype(name))
        for name in ["bool", "bfloat16", "float8_e4m3fn", "float8_e8m0fnu", "complex128"]
    }
    tc.save(path, tree)
    header, _ = read_header(path)
    codes = {name: header[name]["dtype"] for name in tree}
    assert codes == {
        "bool": "BOOL",
        "bfloat16": "BF16",
        "float8_e4m3fn": "F8_E4M3",
        "float8_e8m0fnu": "F8_E8M0",
        "complex128": "U8",
    }
    assert header["complex128"]["shape"] == [2, 16]  # raw bytes: one more axis


def test_prng_keys_round_trip():
    tree = {
        "key": jax.random.key(3),
        "keys": jax.random.split(jax.random.key(4), 3),
        "rbg": jax.random.key(5, impl="rbg"),
    }
    restored = round_trip(tree)
    assert_same(restored, tree)
    assert str(restored["rbg"].dtype) == "key<rbg>"


def test_python_numbers_round_trip_with_their_types():
    tree = {
        "int": 3,
        "big": 2**80,
        "float": 0.1,
        "nan": float("nan"),
        "inf": -float("inf"),
        "zero": -0.0,
        "complex": 1 - 2j,
        "bool": True,
        "frozen": tc.freeze(7),
    }
    restored = round_trip(tree)
    assert_same(restored, tree)
    assert str(restored["zero"]) == "-0.0"


@pytest.mark.parametrize(
    "like, value, expected",
    [
        (0.0, 2, 2.0),
        (0j, 2.5, 2.5 + 0j),
        (0, np.int32(3), 3),
        (0.0, np.float32(1.5), 1.5),
        (0j, np.float32(1.5), 1.5 + 0j),
        (False, np.bool_(True), True),
        (0.0, np.asarray(0.5, ml_dtypes.bfloat16), 0.5),
    ],
)
def test_a_number_takes_a_value_its_type_holds_exactly(like, value, expected):
    restored = tc.from_state_dict({"n": like}, {"n": value})
    assert type(restored["n"]) is type(like) and restored["n"] == expected
    assert round_trip({"n": value}, like={"n": like}) == {"n": expected}


@pytest.mark.parametrize(
    "like, value",
    [
        (0, 2.5),
        (0, True),
        (False, 1),
        (0.0, 1j),
        (0, np.float32(1)),
        (0.0, np.complex64(1)),
        (0, np.zeros(2, np.int32)),
        (0, jax.random.key(0)),
    ],
)
def test_a_number_refuses_a_value_its_type_cannot_hold(like, value):
    _, report = tc.from_state_dict({"n": like}, {"n": value}, strict=False)
    assert report.mismatched == ("tree['n']",)
    _, report = round_trip({"n": value}, like={"n": like}, strict=False)
    assert report.mismatched == ("tree['n']",)


def test_an_abstract_scalar_takes_a_saved_number_of_its_kind_only():
    abstract = jax.eval_shape(lambda: {"i": 1, "f": 0.5, "c": 1j, "b": True})
    saved = {"i": 2, "f": 1.5, "c": 2j, "b": False}
    assert round_trip(saved, like=abstract) == saved
    with pytest.raises(ValueError, match=r"tree\['b'\], tree\['f'\], tree\['i'\] of the abs"):
        round_trip({"i": 1.5, "f": 2j, "c": 2j, "b": 1}, like=abstract, strict=False)


def test_frozen_arrays_come_from_the_file_not_the_template():
    model = MLP([3, 4, 2], seed=0)
    other = MLP([3, 4, 2], seed=1)  # a different frozen table, step, scale, bias
    restored = round_trip(model, like=other)
    assert_same(restored, model)
    assert tc.is_frozen(restored.embed)


def test_frozen_strings_and_tuples_come_from_the_file_and_functions_from_the_template():
    saved = {"act": tc.freeze("relu"), "sizes": tc.freeze((3, 4.0, "x")), "fn": tc.freeze(abs)}
    like = {"act": tc.freeze("gelu"), "sizes": tc.freeze((0, 0.0, "")), "fn": tc.freeze(len)}
    restored = round_trip(saved, like=like)
    assert tc.unfreeze(restored["act"]) == "relu"
    assert tc.unfreeze(restored["sizes"]) == (3, 4.0, "x")
    assert tc.unfreeze(restored["fn"]) is len  # functions are never saved


def test_a_frozen_subtree_is_restored_and_frozen_again():
    model = MLP([3, 4, 2]).at["layers"][0].apply(tc.freeze)
    like = MLP([3, 4, 2], seed=1).at["layers"][0].apply(tc.freeze)
    restored = round_trip(model, like=like)
    assert_same(restored, model)
    assert tc.is_frozen(restored.layers[0].weight)


def test_static_fields_are_recorded_and_checked(tmp_path):
    path = tmp_path / "model.safetensors"
    tc.save(path, MLP([3, 4, 2]))
    header, _ = read_header(path)
    document = json.loads(header["__metadata__"]["treeclass"])
    assert document["values"]["layers.1.name"] == {"kind": "static", "value": "layer1"}
    renamed = (
        MLP([3, 4, 2])
        .at["layers"][1]
        .apply(
            lambda layer: Linear(layer.weight, layer.bias, name="head"),
            is_leaf=lambda x: isinstance(x, Linear),
        )
    )
    with pytest.raises(ValueError, match=r"static +MLP\.layers\[1\]\.name: 'head' \(a `str`\)"):
        tc.load(path, renamed)


def test_nested_containers_round_trip():
    tree = {
        "list": [jnp.ones(2), (np.arange(3), {"deep": jnp.zeros((1, 2))})],
        "pair": Pair(jnp.ones(1), Pair(2.5, "text")),
        "layers": {"a": Linear(jnp.ones((2, 2)), jnp.zeros(2)), "b": MLP([2, 2])},
        "by_index": {0: jnp.ones(1), 1: [jnp.zeros(1)]},
        "none": None,
        "empty": ({}, [], ()),
        "frozen": tc.freeze({"table": jnp.arange(4), "name": "t"}),
    }
    assert_same(round_trip(tree), tree)
    assert_same(tc.from_state_dict(tree, tc.state_dict(tree)), tree)


def test_arrays_take_the_template_type():
    saved = {"a": np.arange(3.0, dtype=np.float32), "b": jnp.arange(3.0)}
    like = {"a": jnp.zeros(3), "b": np.zeros(3, np.float32)}
    restored = round_trip(saved, like=like)
    assert isinstance(restored["a"], jax.Array) and isinstance(restored["b"], np.ndarray)
    assert restored["a"].tolist() == restored["b"].tolist() == [0.0, 1.0, 2.0]


def test_load_into_an_abstract_template():
    model = MLP([3, 4, 2])
    abstract = jax.eval_shape(lambda: MLP([3, 4, 2], seed=1))
    assert isinstance(abstract.layers[0].weight, jax.ShapeDtypeStruct)
    restored = round_trip(model, like=abstract)
    # eval_shape makes every leaf abstract, Python numbers too: the file says what they were
    assert restored.step == 0 and type(restored.step) is int and restored.scale == 0.5
    assert_same(restored, model)


def test_load_places_arrays_with_the_sharding_of_an_abstract_leaf():
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    like = {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32, sharding=sharding)}
    restored = round_trip({"w": jnp.ones((2, 3))}, like=like)
    assert restored["w"].sharding == sharding and restored["w"].committed


def test_loaded_model_runs_under_jit_without_a_retrace():
    model = MLP([3, 4, 2])
    traces = []

    @jax.jit
    def forward(m, x):
        traces.append(1)
        for layer in m.layers:
            x = x @ layer.weight + layer.bias
        return x + tc.unfreeze(m.embed).sum()

    forward(model, jnp.ones((1, 3)))
    restored = round_trip(model)
    forward(restored, jnp.ones((1, 3)))
    assert len(traces) == 1  # equal frozen values: the same tree definition


# ------------------------------------------------------------------------------------------
# state_dict / from_state_dict
# ------------------------------------------------------------------------------------------


def test_state_dict_holds_only_data_in_nested_dicts():
    model = MLP([3, 4, 2])
    state = tc.state_dict(model)
    assert sorted(state) == ["embed", "layers", "scale", "step"]
    assert sorted(state["layers"]) == [0, 1]  # sequence indices as ints
    assert sorted(state["layers"][0]) == ["bias", "weight"]  # no act, no static name
    assert state["embed"] is tc.unfreeze(model.embed)  # unfrozen, not copied
    assert state["step"] == 0 and state["scale"] == 0.5


def test_state_dict_of_an_abstract_model_is_an_orbax_restore_target():
    abstract = jax.eval_shape(lambda: MLP([3, 4, 2]))
    state = tc.state_dict(abstract)
    leaves = jax.tree_util.tree_leaves(state)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert state["embed"].shape == (5, 3)  # the frozen table, traced inside eval_shape


def test_from_state_dict_refreezes_what_was_frozen_and_keeps_the_template_rest():
    model, like = MLP([3, 4, 2]), MLP([3, 4, 2], seed=1)
    restored = tc.from_state_dict(like, tc.state_dict(model))
    assert_same(restored, model)
    assert tc.unfreeze(restored.layers[0].act) is tc.unfreeze(like.layers[0].act)


def test_from_state_dict_accepts_string_indices_as_orbax_restores_them():
    model = MLP([3, 4, 2])
    state = tc.state_dict(model)
    state["layers"] = {str(k): v for k, v in state["layers"].items()}
    state["step"] = np.asarray(0)  # orbax gives some scalars back as 0-d arrays
    restored = tc.from_state_dict(MLP([3, 4, 2], seed=1), state)
    assert_same(restored, model)


def test_from_state_dict_reports_every_problem_at_once():
    state = tc.state_dict(MLP([3, 4, 2]))
    state["layers"][1]["wieght"] = state["layers"][1].pop("weight")
    state["layers"][0]["bias"] = jnp.zeros(5)
    state["extra"] = jnp.ones(1)
    with pytest.raises(ValueError) as info:
        tc.from_state_dict(MLP([3, 4, 2]), state)
    message = str(info.value)
    assert "3 problems" not in message and "4 problems" in message
    assert "missing     MLP.layers[1].weight: no 'layers.1.weight' in the state dict" in message
    assert "(closest: 'layers.1.wieght')" in message
    assert "shape       MLP.layers[0].bias" in message
    assert "unexpected  'extra'" in message and "unexpected  'layers.1.wieght'" in message
    assert "strict=False" not in message
    assert "rules=[('layers.{i}.wieght', 'layers.{i}.weight')]" in message


def test_from_state_dict_non_strict_restores_what_fits():
    like = MLP([3, 4, 2], seed=1)
    state = tc.state_dict(MLP([3, 4, 2]))
    del state["layers"][1]
    restored, report = tc.from_state_dict(like, state, strict=False)
    assert report.missing == ("MLP.layers[1].weight", "MLP.layers[1].bias")
    assert report.kept == report.missing and report.unexpected == ()
    assert restored.layers[1].bias is like.layers[1].bias
    assert_same(restored.layers[0], MLP([3, 4, 2]).layers[0])


def test_from_state_dict_needs_a_dict():
    with pytest.raises(TypeError, match="expects a dict"):
        tc.from_state_dict({"a": jnp.ones(1)}, [jnp.ones(1)])


def test_a_single_leaf_has_no_key_path_to_name_it():
    with pytest.raises(ValueError, match=r"(?s)needs a tree with keys.*\{'value': value\}"):
        tc.state_dict(jnp.ones(2))
    with pytest.raises(ValueError, match=r"tc.save\(path, \{'value': value\}\)"):
        tc.save("never-written.safetensors", 1.0)


# ------------------------------------------------------------------------------------------
# strict and non-strict loads
# ------------------------------------------------------------------------------------------


class Block(tc.TreeClass):
    weight: jax.Array
    count: int
    tag: str
    name: str = tc.field(default="block", static=True)


def _mismatched_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "blocks.safetensors"
    tc.save(
        path,
        {
            "blocks": [Block(jnp.ones((2, 2)), 1, "a"), Block(jnp.ones(2), 2, "b")],
            "head": jnp.ones(3),
            "old": jnp.ones(1),
        },
    )
    return path


def _template() -> dict:
    return {
        "blocks": [
            Block(jnp.zeros((2, 3)), 0, "x", name="renamed"),  # shape, static
            Block(jnp.zeros(2, jnp.int32), "two", "y"),  # dtype, type
        ],
        "heads": jnp.zeros(3),  # missing (closest: head); "head", "old" unexpected
    }


def test_strict_load_reports_every_problem_at_once(tmp_path):
    path, like = _mismatched_file(tmp_path), _template()
    with pytest.raises(ValueError) as info:
        tc.load(path, like)
    message = str(info.value)
    expected = [
        "7 problems",
        "static      tree['blocks'][0].name: 'renamed' (a `str`) in the template, 'block' "
        "(a `str`) in the file",
        "shape       tree['blocks'][0].weight: an array f32[2,3] in the template, an "
        "array f32[2,2] in the file",
        "dtype       tree['blocks'][1].weight: an array i32[2] in the template, an array "
        "f32[2] in the file",
        "type        tree['blocks'][1].count: 'two' (a `str`) in the template, 2 (an `int`) in "
        "the file",
        "missing     tree['heads']: no 'heads' in the file (closest: 'head')",
        "unexpected  'head' (an array f32[3]) in the file",
        "unexpected  'old' (an array f32[1]) in the file",
        "Fixes that fit these problems:",
        "- tree['blocks'][1].weight is float32 in the file and int32 in the template: "
        "convert it while loading with a key rule, rules=[('blocks.1.weight', "
        "'blocks.1.weight', lambda w: w.astype(jnp.int32))]",
        "- renamed paths: map the checkpoint's names with key rules, rules=[('head', 'heads')]",
        "- to leave out what the template has no place for: tc.load(path, model, "
        'unexpected="ignore")',
    ]
    for line in expected:
        assert line in message, (line, message)
    assert "strict=False" not in message  # never the blanket waiver


@LOSSY
def test_non_strict_load_restores_what_fits_and_reports_the_rest(tmp_path):
    path, like = _mismatched_file(tmp_path), _template()
    restored, report = tc.load(path, like, strict=False)
    assert report.missing == ("tree['heads']",)
    assert report.mismatched == (
        "tree['blocks'][0].name",
        "tree['blocks'][0].weight",
        "tree['blocks'][1].weight",
        "tree['blocks'][1].count",
    )
    assert report.unexpected == ("head", "old")
    assert len(report.messages) == 7 and report.kept == report.missing + report.mismatched
    first, second = restored["blocks"]
    assert first.weight is like["blocks"][0].weight and first.name == "renamed"  # kept
    assert first.count == 1 and first.tag == "a"  # restored
    assert second.weight is like["blocks"][1].weight and second.count == "two"
    assert second.tag == "b"
    assert restored["heads"] is like["heads"]


def test_a_clean_non_strict_load_reports_nothing():
    model = MLP([3, 4, 2])
    restored, report = round_trip(model, strict=False)
    assert report.kept == report.unexpected == report.messages == ()
    assert_same(restored, model)


def test_an_abstract_template_leaf_that_nothing_fills_is_an_error_naming_it(tmp_path):
    path = tmp_path / "encoder.safetensors"
    tc.save(path, {"encoder": {"w": jnp.ones((2, 2))}})
    like = jax.eval_shape(lambda: {"encoder": {"w": jnp.zeros((2, 2))}, "head": jnp.zeros(2)})
    for options in ({"strict": False}, {"missing": "keep"}, {"missing": "warn"}):
        with pytest.raises(ValueError, match=r"encoder\.safetensors leaves tree\['head'\] of "):
            tc.load(path, like, **options)
    report = tc.load(path, like, strict=False, dry_run=True)  # a dry run only reports it
    assert report.missing == ("tree['head']",)
    # outside a partial load's selection, the template is kept as given
    selection = {"encoder": {"w": True}, "head": False}
    restored = tc.load(path, like, where=selection, strict=False)[0]
    assert isinstance(restored["head"], jax.ShapeDtypeStruct)
    assert restored["encoder"]["w"].tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_a_failed_load_leaves_the_template_unchanged(tmp_path):
    path, like = _mismatched_file(tmp_path), _template()
    leaves = jax.tree_util.tree_leaves(like)
    with pytest.raises(ValueError):
        tc.load(path, like)
    assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(like), leaves))
    assert like["blocks"][0].name == "renamed"


# ------------------------------------------------------------------------------------------
# corrupted, truncated and foreign files
# ------------------------------------------------------------------------------------------


def _good_file(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    path = tmp_path / "good.safetensors"
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(4, jnp.bfloat16), "s": "text"}
    tc.save(path, tree)
    return path, tree


@pytest.mark.parametrize("keep", [0, 5, 8, 20, -1, -9])
def test_a_truncated_file_is_a_value_error_that_says_so(tmp_path, keep):
    path, tree = _good_file(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[:keep] if keep >= 0 else raw[: len(raw) + keep])
    for strict in (True, False):
        with pytest.raises(ValueError, match="not a checkpoint tc.load can read"):
            tc.load(path, tree, strict=strict)


def _corrupt_header(header: dict) -> None:
    header["a"]["dtype"] = "F33"


def _overlap(header: dict) -> None:
    header["b"]["data_offsets"] = [0, 8]


def _bad_shape(header: dict) -> None:
    header["a"]["shape"] = [2, 2]


def _bad_metadata(header: dict) -> None:
    header["__metadata__"]["treeclass"] = "{not json"


def _bad_value(header: dict) -> None:
    document = json.loads(header["__metadata__"]["treeclass"])
    document["values"]["s"]["value"] = {"unknown": 1}
    header["__metadata__"]["treeclass"] = json.dumps(document)


@pytest.mark.parametrize(
    "corrupt, reason",
    [
        (_corrupt_header, "unknown dtype 'F33'"),
        (_overlap, "starts at byte"),
        (_bad_shape, "needs 16 bytes, but its byte range holds 24"),
        (_bad_metadata, "treeclass metadata is not valid JSON"),
        (_bad_value, "a value in its treeclass metadata is malformed"),
    ],
)
def test_a_corrupted_header_is_a_value_error_that_says_so(tmp_path, corrupt, reason):
    path, tree = _good_file(tmp_path)
    header, data = read_header(path)
    corrupt(header)
    write_header(path, header, data)
    with pytest.raises(ValueError, match=reason):
        tc.load(path, tree, strict=False)


def test_garbage_and_other_formats_are_value_errors(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x00" * 8 + b"{}" * 10)
    with pytest.raises(ValueError, match="header is not valid JSON"):
        tc.load(path, {"a": jnp.ones(1)})
    path.write_bytes(struct.pack("<Q", 2) + b"{}" + b"\x00" * 20)
    with pytest.raises(ValueError, match="20 bytes follow the last tensor"):
        tc.load(path, {"a": jnp.ones(1)})
    (tmp_path / "x.bin").write_bytes(b"GARBAGE!" * 4)
    with pytest.raises(ValueError, match="cannot tell the format"):
        tc.load(tmp_path / "x.bin", {"a": jnp.ones(1)})
    path.write_bytes(struct.pack("<Q", 6) + b"\xff\xfe{}{}")
    with pytest.raises(ValueError, match="not valid JSON"):
        tc.load(path, {"a": jnp.ones(1)})


def test_a_file_written_by_plain_safetensors_loads_by_key_path(tmp_path):
    from safetensors.numpy import save_file

    model = MLP([3, 4, 2], seed=1)
    tensors = {
        "layers.0.weight": np.full((3, 4), 2.0, np.float32),
        "layers.0.bias": np.ones(4, np.float32),
        "layers.1.weight": np.full((4, 2), 3.0, np.float32),
        "layers.1.bias": np.ones(2, np.float32),
        "embed": np.zeros((5, 3), np.float32),
        "step": np.asarray(12, np.int64),
        "scale": np.asarray(0.25, np.float32),
    }
    save_file(tensors, str(tmp_path / "foreign.safetensors"))
    restored = tc.load(tmp_path / "foreign.safetensors", model)
    assert restored.layers[1].weight.tolist() == [[3.0, 3.0]] * 4
    assert tc.is_frozen(restored.embed) and not np.asarray(tc.unfreeze(restored.embed)).any()
    assert restored.step == 12 and type(restored.step) is int and restored.scale == 0.25
    # strings and static values come from the template: the file has none
    assert tc.unfreeze(restored.kind) == "mlp" and restored.layers[1].name == "layer1"

    tensors["head.weight"] = np.ones(1, np.float32)
    save_file(tensors, str(tmp_path / "more.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected  'head\.weight'"):
        tc.load(tmp_path / "more.safetensors", model)


def test_our_file_is_readable_by_safetensors(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    model = MLP([3, 4, 2])
    tc.save(tmp_path / "model.safetensors", model)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(tensors) == [
        "embed",
        "layers.0.bias",
        "layers.0.weight",
        "layers.1.bias",
        "layers.1.weight",
    ]
    assert np.array_equal(tensors["layers.0.weight"], model.layers[0].weight)
    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as file:
        document = json.loads(file.metadata()["treeclass"])
    assert document["root"] == "MLP" and document["tensors"]["embed"] == {"kind": "frozen"}
    assert document["values"]["kind"] == {"kind": "frozen", "value": "mlp"}
    assert document["objects"]["layers.0.act"] == {"kind": "frozen", "type": "custom_jvp"}


def test_bfloat16_and_float8_files_are_readable_by_safetensors(tmp_path):
    from safetensors import safe_open

    tree = {
        "b": jnp.ones(3, jnp.bfloat16),
        "f": jnp.ones(2, jnp.float8_e5m2),
        "c": np.ones(2, np.complex128),
    }
    tc.save(tmp_path / "t.safetensors", tree)
    with safe_open(str(tmp_path / "t.safetensors"), framework="np") as file:
        dtypes = {name: file.get_slice(name).get_dtype() for name in file.keys()}
    assert dtypes == {"b": "BF16", "f": "F8_E5M2", "c": "U8"}


# ------------------------------------------------------------------------------------------
# safety: no pickle, atomic writes, what save refuses
# ------------------------------------------------------------------------------------------


def test_the_checkpoint_package_imports_no_pickle():
    modules = sorted((ROOT / "treeclass" / "_checkpoint").rglob("*.py"))
    assert len(modules) > 3
    imported = set()
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
    assert not {name for name in imported if "pickle" in name or "marshal" in name}


_NO_PICKLE_ON_LOAD = """
import sys, pickle, _pickle
import jax, jax.numpy as jnp, numpy as np
import treeclass as tc

path = sys.argv[1]
tree = {"w": jnp.ones((2, 2)), "n": np.arange(3), "s": tc.freeze("x"), "k": 3}
tc.save(path, tree)

def refuse(*args, **kwargs):
    raise AssertionError("pickle was used")

for module in (pickle, _pickle):
    for name in ("load", "loads", "Unpickler", "_load", "_loads", "_Unpickler"):
        if hasattr(module, name):
            setattr(module, name, refuse)

def hook(event, args):
    if event.startswith("pickle."):
        raise AssertionError(event)
    if event == "import" and "pickle" in str(args[0]):
        raise AssertionError("imported " + str(args[0]))

sys.addaudithook(hook)
restored = tc.load(path, tree)
assert restored["n"].tolist() == [0, 1, 2] and tc.unfreeze(restored["s"]) == "x"
print("ok")
"""


def test_load_uses_no_pickle(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _NO_PICKLE_ON_LOAD, str(tmp_path / "t.safetensors")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_importing_treeclass_imports_neither_orbax_nor_safetensors(cloudpickled):
    # what the fresh process that writes the cloudpickle payload below had loaded right
    # after `import treeclass` (one start of a process for both)
    assert cloudpickled["imported"] == "[]"


def test_a_save_that_fails_midway_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "model.safetensors"
    tc.save(path, {"a": jnp.ones(3), "b": jnp.ones(4)})
    before = path.read_bytes()
    broken = jnp.zeros(4)
    broken.delete()  # its shape is known, so the header is written; reading its data fails
    with pytest.raises(RuntimeError, match="deleted"):
        tc.save(path, {"a": jnp.full(3, 2.0), "b": broken})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_a_save_that_fails_at_the_rename_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    tc.save(path, {"a": jnp.ones(3)})
    before = path.read_bytes()

    def fail(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk gone"):
        tc.save(path, {"a": jnp.zeros(3)})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_save_refuses_what_it_cannot_save_before_touching_the_file(tmp_path):
    path = tmp_path / "model.safetensors"
    abstract = jax.eval_shape(lambda: {"w": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"abstract value at tree\['w'\]"):
        tc.save(path, abstract)
    with pytest.raises(ValueError, match="same checkpoint name 'a.b'"):
        tc.save(path, {"a.b": jnp.ones(1), "a": {"b": jnp.ones(1)}})
    with pytest.raises(ValueError, match="no fixed-size bytes"):
        tc.save(path, {"o": np.array(["x", None], dtype=object)})
    assert os.listdir(tmp_path) == []


def test_save_leaves_the_tree_unchanged(tmp_path):
    model = MLP([3, 4, 2])
    leaves = jax.tree_util.tree_leaves(model)
    tc.save(tmp_path / "m.safetensors", model)
    assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(model), leaves))


def test_save_holds_about_one_leaf_on_the_host_at_a_time(tmp_path):
    # transposed numpy leaves need a contiguous copy each: the peak is one copy, not all
    leaves = {f"w{i}": np.ones((256, 512), np.float32).T for i in range(8)}
    largest = 256 * 512 * 4
    tracemalloc.start()
    try:
        tc.save(tmp_path / "big.safetensors", leaves)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * largest, (peak, largest)


@pytest.mark.parametrize(
    "stacked, layers, side",
    [(False, 6, 512), (True, 6, 512), (False, 64, 128), (True, 64, 128)],
    ids=["leaves", "stacked", "small-leaves", "small-stacked"],
)
def test_load_holds_about_one_tensor_on_the_host_at_a_time(tmp_path, stacked, layers, side):
    # each tensor read is put on the device and its host buffer freed soon after (JAX's
    # transfer leaves a cycle that would keep it until the collector's pass): at most
    # 1 MiB of them waits for the pass, so small tensors do not pile up either; into a
    # stack, through per-layer rules, each layer is written into its slot
    shape = (side, side)
    largest = side * side * 4
    names = {f"h.{i}.w": np.full(shape, i, np.float32) for i in range(layers)}
    path = tmp_path / "layers.safetensors"
    tc.save(path, names)
    if stacked:
        like = {"blocks": tc.Stacked.from_blocks([{"w": jnp.zeros(shape)}] * layers)}
        rules = [("h.{i}.w", "['blocks'][{i}]['w']")]
    else:
        like = {"h": {str(i): {"w": jnp.zeros(shape)} for i in range(layers)}}
        rules = None
    like = jax.eval_shape(lambda: like)
    tc.load(path, like, rules=rules)  # compiles what the load runs, outside the count
    tracemalloc.start()
    try:
        loaded = jax.block_until_ready(tc.load(path, like, rules=rules))
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # (on the CPU a device array may alias its host buffer: the result's, not extra)
    bound = 1.5 * largest if largest >= 2**20 else 2**20 + 2 * largest
    assert peak - held < bound, (peak - held, held, largest)
    got = (
        loaded["blocks"].tree["w"]
        if stacked
        else np.stack([loaded["h"][str(i)]["w"] for i in range(layers)])
    )
    assert np.array_equal(np.asarray(got)[:, 0, 0], np.arange(layers))


# ------------------------------------------------------------------------------------------
# properties: the round-trip laws
# ------------------------------------------------------------------------------------------

_PROPERTY_DTYPES = [
    "bool",
    "int8",
    "uint16",
    "int32",
    "float16",
    "bfloat16",
    "float32",
    "complex64",
    "float8_e4m3fn",
    "int4",
]

arrays = st.builds(
    lambda name, shape, seed, as_jax: (
        jnp.asarray(random_array(_dtype(name), shape, seed))
        if as_jax
        else random_array(_dtype(name), shape, seed)
    ),
    st.sampled_from(_PROPERTY_DTYPES),
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.integers(0, 2**16),
    st.booleans(),
)
plain = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=5),
    st.complex_numbers(allow_nan=False),
)
leaves = st.one_of(arrays, plain, arrays.map(tc.freeze), plain.map(tc.freeze))
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.dictionaries(st.text("abc", min_size=1, max_size=3), children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3),
        st.builds(Pair, children, children),
    ),
    max_leaves=8,
).filter(lambda tree: isinstance(tree, (dict, list, Pair)))


@settings(max_examples=40, deadline=None)
@given(trees)
def test_load_of_save_is_the_identity(tree):
    assert_same(round_trip(tree), tree)


@settings(max_examples=40, deadline=None)
@given(trees)
def test_from_state_dict_of_state_dict_is_the_identity(tree):
    assert_same(tc.from_state_dict(tree, tc.state_dict(tree)), tree)


# ------------------------------------------------------------------------------------------
# cloudpickle of locally defined classes, in fresh interpreters
# ------------------------------------------------------------------------------------------

_CLOUDPICKLE_WRITE = """
import sys
import treeclass as tc

# (this fresh process also answers which checkpoint libraries `import treeclass` loads)
imported = sorted(m for m in sys.modules if m.split('.')[0] in ('orbax', 'safetensors'))
import cloudpickle, jax, jax.numpy as jnp

def make_class():
    class Local(tc.TreeClass):
        weight: jax.Array
        name: str = tc.field(default="local", static=True)

        def __call__(self, x):
            return x @ self.weight

    return Local

class InMain(tc.TreeClass):  # defined in __main__, as in a notebook cell
    rate: float = 0.5

Local = make_class()
payload = (Local, Local(jnp.ones((2, 2))), InMain())
with open(sys.argv[1], "wb") as file:
    cloudpickle.dump(payload, file)
print(imported)
"""

_CLOUDPICKLE_READ = """
import sys, cloudpickle, jax, jax.numpy as jnp

with open(sys.argv[1], "rb") as file:
    Local, model, in_main = cloudpickle.load(file)
assert type(model) is Local and model.name == "local"
assert model(jnp.ones((1, 2))).tolist() == [[2.0, 2.0]]
assert len(jax.tree_util.tree_leaves(model)) == 1
assert Local(jnp.zeros((2, 2))).at["weight"].set(jnp.ones((2, 2))).weight.sum() == 4.0
assert in_main.rate == 0.5 and jax.tree_util.tree_leaves(in_main) == [0.5]
print("ok")
"""


def _fresh_python(script: str, target: str) -> str:
    """What `script` printed, run as `python -c` in a fresh interpreter on the CPU, from the
    checkout (whose treeclass it imports)."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), target],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


@pytest.fixture(scope="module")
def cloudpickled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("cloudpickle")
    target = str(folder / "payload.pkl")
    return {"imported": _fresh_python(_CLOUDPICKLE_WRITE, target), "target": target}


def test_cloudpickle_of_locally_defined_classes_in_a_fresh_interpreter(cloudpickled):
    # written by one fresh process (the fixture), read by another
    assert _fresh_python(_CLOUDPICKLE_READ, cloudpickled["target"]) == "ok"


# ------------------------------------------------------------------------------------------
# 8 devices and orbax (in a subprocess)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def multidevice_results() -> dict:
    return run_check_script("checkpoint_multidevice_check.py")


@pytest.mark.parametrize(
    "check",
    [
        "eight_devices",
        "orbax_round_trip_with_an_abstract_sharded_template",
        "orbax_restore_without_a_target_is_placed_like_the_template",
        "save_and_load_with_an_abstract_sharded_template",
        "load_into_a_sharded_model_keeps_its_shardings",
    ],
)
def test_many_devices(multidevice_results, check):
    assert multidevice_results[check] == "ok", multidevice_results[check]


# ------------------------------------------------------------------------------------------
# Loading into sharded templates: each shard's bytes read once (8 devices, in the subprocess
# of the checks above: `sharded_load_reads_each_byte_once` there, one outcome per case)
# ------------------------------------------------------------------------------------------


@needs_read_counts
def test_load_into_sharded_templates_reads_each_byte_once_and_places_every_shard(
    multidevice_results,
):
    outcomes = multidevice_results["sharded_load_reads_each_byte_once"]
    assert isinstance(outcomes, dict), outcomes  # a traceback: the cases could not start
    assert len(outcomes) == 15
    failed = {key: outcome for key, outcome in outcomes.items() if outcome != "ok"}
    assert not failed, "\n".join(f"{key}:\n{outcome}" for key, outcome in failed.items())


def test_save_writes_the_metadata_it_is_given_beside_its_own(tmp_path):
    from safetensors import safe_open

    path = tmp_path / "m.safetensors"
    model = {"w": jnp.ones(2), "act": tc.freeze("relu")}
    tc.save(path, model, metadata={"format": "pt", "note": "v2"})
    with safe_open(str(path), "np") as f:
        assert f.metadata()["format"] == "pt" and f.metadata()["note"] == "v2"
    assert tc.is_tree_equal(tc.load(path, model), model)
    with pytest.raises(ValueError, match="treeclass writes it"):
        tc.save(path, model, metadata={"treeclass": "x"})


def test_unsigned_zeros_clears_only_the_sign_of_zeros_and_keeps_the_value_type():
    # the helper the round trip uses where the device itself drops the sign (a TPU's f64)
    out = _unsigned_zeros(np.array([-0.0, -1.5, 0.0]))
    assert np.signbit(out).tolist() == [False, True, False] and out.dtype == np.float64
    z = _unsigned_zeros(np.array([complex(-0.0, -0.0), complex(-2.0, -0.0)]))
    assert np.signbit(z.real).tolist() == [False, True] and not np.signbit(z.imag).any()
    scalar = _unsigned_zeros(np.float64(-0.0))
    assert type(scalar) is np.float64 and not np.signbit(scalar)
