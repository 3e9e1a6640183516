"""Checkpoints written by other tools: sharded safetensors, npz, flax msgpack, equinox.

Every fixture is written in the test by the real writer (`safetensors.numpy.save_file`
split into shards the way large-model repositories lay them out, `np.savez`,
`flax.serialization.to_bytes`, `eqx.tree_serialise_leaves`); models loaded from them
must compute what the writing library computes.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import struct
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import MLP, needs_read_counts
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

import treeclass as tc


def write(path, data: bytes) -> str:
    with open(path, "wb") as file:
        file.write(data)
    return str(path)


def read_json(path) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def mlp_template() -> MLP:
    return MLP((3, 4, 2), key=jax.random.key(7))


def assert_tree_equal(a, b) -> None:
    assert tc.is_tree_equal(a, b), (a, b)


# --------------------------------------------------------------------------------------
# Sharded safetensors
# --------------------------------------------------------------------------------------


def torch_mlp_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """An MLP as PyTorch names and lays it out: `[out, in]` weights."""
    rng = np.random.default_rng(seed)
    return {
        "model.layers.0.weight": rng.normal(size=(4, 3)).astype(np.float32),
        "model.layers.0.bias": rng.normal(size=4).astype(np.float32),
        "model.layers.1.weight": rng.normal(size=(2, 4)).astype(np.float32),
        "model.layers.1.bias": rng.normal(size=2).astype(np.float32),
    }


TORCH_RULES = [
    ("model.layers.{i}.weight", "layers[{i}].weight", lambda w: w.T),
    ("model.layers.{i}.bias", "layers[{i}].bias"),
]


def write_repository(folder, tensors: dict[str, np.ndarray], shards: list[list[str]]) -> str:
    """Shards and an index as huggingface's writers lay them out: shard files named
    `model-0000k-of-0000n.safetensors`, an index with `metadata.total_size` and a
    `weight_map` sorted by name."""
    weight_map = {}
    for k, names in enumerate(shards, 1):
        shard = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(folder / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in names})
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    path = folder / "model.safetensors.index.json"
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return str(path)


@pytest.fixture
def repository(tmp_path):
    tensors = torch_mlp_tensors()
    names = list(tensors)
    path = write_repository(tmp_path, tensors, [names[:1], names[1:3], names[3:]])
    return path, tensors


@pytest.mark.usefixtures("highest_precision")
def test_a_sharded_repository_loads_through_rules(repository):
    path, tensors = repository
    model = tc.load(path, mlp_template(), rules=TORCH_RULES)
    x = np.ones((5, 3), np.float32)
    hidden = np.maximum(x @ tensors["model.layers.0.weight"].T + tensors["model.layers.0.bias"], 0)
    expected = hidden @ tensors["model.layers.1.weight"].T + tensors["model.layers.1.bias"]
    np.testing.assert_allclose(model(x), expected, rtol=1e-6)


def test_a_folder_holding_one_index_loads_as_the_index(repository, tmp_path):
    path, _ = repository
    by_index = tc.load(path, mlp_template(), rules=TORCH_RULES)
    assert_tree_equal(tc.load(tmp_path, mlp_template(), rules=TORCH_RULES), by_index)


def test_a_folder_with_two_checkpoints_is_an_error_naming_them(tmp_path):
    save_file({"a": np.ones(1, np.float32)}, str(tmp_path / "a.safetensors"))
    save_file({"a": np.ones(1, np.float32)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(ValueError, match=r"is a folder.*a\.safetensors, b\.safetensors"):
        tc.load(tmp_path, {"a": jnp.zeros(1)})


def test_a_sharded_dry_run_reports_each_path_with_its_name(repository):
    path, _ = repository
    report = tc.load(path, mlp_template(), rules=TORCH_RULES, dry_run=True)
    assert report.messages == ()
    assert report.sources["MLP.layers[1].weight"] == ("model.layers.1.weight",)


def test_an_index_naming_a_missing_shard_is_an_error_naming_both(repository, tmp_path):
    path, _ = repository
    os.unlink(tmp_path / "model-00002-of-00003.safetensors")
    with pytest.raises(ValueError, match=r"index\.json.*model-00002-of-00003.*does not exist"):
        tc.load(path, mlp_template(), rules=TORCH_RULES)


def test_an_index_and_shards_that_disagree_are_an_error(repository, tmp_path):
    path, _ = repository
    index = read_json(path)
    index["weight_map"]["model.layers.0.bias"] = "model-00001-of-00003.safetensors"
    write(path, json.dumps(index).encode())
    with pytest.raises(ValueError, match=r"maps 'model.layers.0.bias' to the shard .*not hold it"):
        tc.load(path, mlp_template(), rules=TORCH_RULES)
    del index["weight_map"]["model.layers.0.bias"]
    write(path, json.dumps(index).encode())
    with pytest.raises(ValueError, match=r"holds 'model.layers.0.bias', which it maps elsewhere"):
        tc.load(path, mlp_template(), rules=TORCH_RULES)


def test_a_folder_with_a_sharded_index_and_a_single_file_is_refused_naming_both(
    repository, tmp_path
):
    save_file({"a": np.ones(1, np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as info:
        tc.load(tmp_path, mlp_template(), rules=TORCH_RULES)
    message = str(info.value)
    assert "model.safetensors.index.json" in message and "single file model.safetensors" in message
    # the shards the index names are not single files; a readable index loads as before
    os.unlink(tmp_path / "model.safetensors")
    tc.load(tmp_path, mlp_template(), rules=TORCH_RULES)


def test_an_unreadable_index_beside_a_single_file_is_refused_naming_both(tmp_path):
    write(tmp_path / "model.safetensors.index.json", b"{not json")
    save_file({"a": np.ones(1, np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    with pytest.raises(ValueError, match="not valid JSON"):  # shards by their names: the index
        tc.load(tmp_path, {"a": jnp.zeros(1)})
    save_file({"a": np.ones(1, np.float32)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(ValueError, match="holds both.*single file weights.safetensors"):
        tc.load(tmp_path, {"a": jnp.zeros(1)})


@pytest.mark.parametrize("shard", ["model\x00.safetensors", "\x00", "a\x00/../b.safetensors"])
def test_an_index_naming_a_shard_with_a_nul_byte_is_refused_naming_the_index(tmp_path, shard):
    index = {"metadata": {}, "weight_map": {"w": shard}}
    path = write(tmp_path / "m.safetensors.index.json", json.dumps(index).encode())
    with pytest.raises(ValueError, match=r"m\.safetensors\.index\.json.*not the name of a file"):
        tc.load(path, {"w": jnp.zeros(1)})


def test_a_path_with_a_nul_byte_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"'model\\x00\.safetensors' cannot name a file"):
        tc.load("model\x00.safetensors", {"w": jnp.zeros(1)})


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors"])
def test_an_index_naming_a_file_outside_its_folder_is_refused(tmp_path, shard):
    index = {"metadata": {}, "weight_map": {"w": shard}}
    path = write(tmp_path / "m.safetensors.index.json", json.dumps(index).encode())
    with pytest.raises(ValueError, match="not the name of a file beside it"):
        tc.load(path, {"w": jnp.zeros(1)})


def sharded_tree() -> dict:
    return {
        "embed": jnp.arange(300, dtype=jnp.float32).reshape(30, 10),
        "layers": [
            {"w": jnp.full((4, 4), i, jnp.bfloat16), "b": jnp.arange(4, dtype=jnp.int4)}
            for i in range(3)
        ],
        "table": tc.freeze(jnp.ones(5, jnp.float16)),
        "step": 12,
        "name": tc.freeze("mlp"),
    }


def shard_sizes(index_path: str) -> dict[str, int]:
    """Each shard's tensor bytes, read with the reference reader."""
    folder = os.path.dirname(index_path)
    index = read_json(index_path)
    sizes = {}
    for shard in set(index["weight_map"].values()):
        with safe_open(os.path.join(folder, shard), "np") as file:
            sizes[shard] = sum(file.get_tensor(k).nbytes for k in file.keys())
    return sizes


def test_a_sharded_save_round_trips_exactly_as_a_single_file(tmp_path):
    tree = sharded_tree()
    path = str(tmp_path / "model.safetensors.index.json")
    tc.save(path, tree, max_shard_size=40)
    assert len(shard_sizes(path)) > 3
    restored = tc.load(path, tree)
    assert_tree_equal(restored, tree)
    assert restored["layers"][2]["w"].dtype == jnp.bfloat16 and tc.is_frozen(restored["table"])
    abstract = jax.eval_shape(lambda: tree)
    assert_tree_equal(tc.load(path, abstract), tree)


def test_shards_hold_at_most_max_shard_size_and_a_bigger_tensor_gets_its_own(tmp_path):
    tree = sharded_tree()  # embed has 1200 bytes, the rest at most 32 each
    path = str(tmp_path / "model.safetensors.index.json")
    tc.save(path, tree, max_shard_size=100)
    index = read_json(path)
    sizes = shard_sizes(path)
    (embed_shard,) = [s for s, n in sizes.items() if n == 1200]
    assert [k for k, s in index["weight_map"].items() if s == embed_shard] == ["embed"]
    assert all(n <= 100 for s, n in sizes.items() if s != embed_shard)
    assert sorted(sizes) == [f"model-{k:05d}-of-{len(sizes):05d}.safetensors" for k in
                             range(1, len(sizes) + 1)]  # fmt: skip
    assert index["metadata"]["total_size"] == sum(sizes.values())


@pytest.mark.parametrize(("size", "limit"), [("1KB", 1000), ("1KiB", 1024), ("0.5kb", 500)])
def test_max_shard_size_takes_huggingface_size_strings(tmp_path, size, limit):
    tree = {f"t{i}": jnp.zeros(100, jnp.uint8) for i in range(25)}  # 100 bytes each
    path = str(tmp_path / "m.safetensors.index.json")
    tc.save(path, tree, max_shard_size=size)
    assert sorted(shard_sizes(path).values()) == sorted(
        [limit // 100 * 100] * (2500 // (limit // 100 * 100))
        + ([2500 % (limit // 100 * 100)] if 2500 % (limit // 100 * 100) else [])
    )


@pytest.mark.parametrize("size", [0, -5, "5 apples", "GB", 1.5, True])
def test_a_bad_max_shard_size_is_refused_before_anything_is_written(tmp_path, size):
    with pytest.raises(ValueError, match="max_shard_size takes"):
        tc.save(tmp_path / "m.safetensors.index.json", {"a": jnp.ones(2)}, max_shard_size=size)
    assert os.listdir(tmp_path) == []


def test_a_sharded_save_is_given_the_index_path(tmp_path):
    with pytest.raises(ValueError, match=r"after:  tc\.save\('.*m\.safetensors\.index\.json'"):
        tc.save(str(tmp_path / "m.safetensors"), {"a": jnp.ones(2)}, max_shard_size="1GB")
    assert os.listdir(tmp_path) == []


def test_a_shard_of_another_save_is_an_error_not_a_mixed_model(tmp_path):
    path = str(tmp_path / "m.safetensors.index.json")
    tree = {"a": jnp.zeros(50, jnp.uint8), "b": jnp.zeros(50, jnp.uint8)}
    tc.save(path, tree, max_shard_size=50)
    old_shard = (tmp_path / "m-00002-of-00002.safetensors").read_bytes()
    tc.save(path, jax.tree_util.tree_map(lambda x: x + 1, tree), max_shard_size=50)
    (tmp_path / "m-00002-of-00002.safetensors").write_bytes(old_shard)  # as if interrupted
    with pytest.raises(ValueError, match=r"m-00002-of-00002.*another save than the index"):
        tc.load(path, tree)


def test_a_resave_removes_the_shards_the_new_index_no_longer_names(tmp_path):
    path = str(tmp_path / "m.safetensors.index.json")
    tree = {k: jnp.zeros(50, jnp.uint8) for k in "abc"}
    (tmp_path / "notes.txt").write_text("mine")
    tc.save(path, tree, max_shard_size=50)
    assert len(os.listdir(tmp_path)) == 5
    tc.save(path, tree, max_shard_size=200)
    assert sorted(os.listdir(tmp_path)) == [
        "m-00001-of-00001.safetensors",
        "m.safetensors.index.json",
        "notes.txt",
    ]
    assert_tree_equal(tc.load(path, tree), tree)


def test_a_resave_removes_only_safetensors_shards_of_the_previous_index(tmp_path):
    path = tmp_path / "m.safetensors.index.json"
    (tmp_path / "notes.txt").write_text("mine")
    weight_map = {"a": "m.safetensors.index.json", "b": "notes.txt", "c": "m.bin"}
    path.write_text(json.dumps({"weight_map": weight_map}))  # an index from elsewhere
    (tmp_path / "m.bin").write_bytes(b"weights")
    tc.save(path, {"a": jnp.ones(2)}, max_shard_size=100)
    assert sorted(os.listdir(tmp_path)) == [
        "m-00001-of-00001.safetensors",
        "m.bin",
        "m.safetensors.index.json",
        "notes.txt",
    ]
    assert_tree_equal(tc.load(path, {"a": jnp.ones(2)}), {"a": jnp.ones(2)})


def test_a_resave_over_a_malformed_index_removes_nothing(tmp_path):
    # one value of its map is no file name: the index is not trusted to say what to delete
    path = tmp_path / "m.safetensors.index.json"
    weight_map = {"a": "old-00001-of-00002.safetensors", "b": ["old-00002-of-00002.safetensors"]}
    path.write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "old-00001-of-00002.safetensors").write_bytes(b"theirs")
    tc.save(path, {"a": jnp.ones(2)}, max_shard_size=100)
    assert sorted(os.listdir(tmp_path)) == [
        "m-00001-of-00001.safetensors",
        "m.safetensors.index.json",
        "old-00001-of-00002.safetensors",
    ]


tensors_strategy = st.lists(st.integers(0, 64), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None)
@given(sizes=tensors_strategy, limit=st.integers(1, 100))
def test_sharding_law_every_limit_round_trips_and_is_respected(tmp_path_factory, sizes, limit):
    folder = tmp_path_factory.mktemp("law")
    tree = {f"t{i}": jnp.full(n, i, jnp.uint8) for i, n in enumerate(sizes)}
    path = str(folder / "m.safetensors.index.json")
    tc.save(path, tree, max_shard_size=limit)
    assert_tree_equal(tc.load(path, tree), tree)
    index = read_json(path)
    for shard, size in shard_sizes(path).items():
        held = [k for k, s in index["weight_map"].items() if s == shard]
        assert size <= limit or len(held) == 1


# --------------------------------------------------------------------------------------
# NumPy .npz
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("writer", [np.savez, np.savez_compressed])
def test_an_npz_file_loads_with_its_keys_as_written(tmp_path, writer):
    tensors = torch_mlp_tensors(seed=3)
    path = str(tmp_path / "weights.npz")
    writer(path, **tensors)
    model = tc.load(path, mlp_template(), rules=TORCH_RULES)
    np.testing.assert_array_equal(model.layers[1].weight, tensors["model.layers.1.weight"].T)
    np.testing.assert_array_equal(model.layers[0].bias, tensors["model.layers.0.bias"])


def test_npz_arrays_of_any_byte_order_memory_order_and_bfloat16_load_as_written(tmp_path):
    values = {
        "big": np.arange(6, dtype=">i4").reshape(2, 3),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
        "brain": np.arange(4).astype(ml_dtypes.bfloat16),
    }
    path = str(tmp_path / "a.npz")
    np.savez(path, **values)
    like = {
        "big": np.zeros((2, 3), np.int32),
        "fortran": jnp.zeros((2, 3)),
        "brain": jnp.zeros(4, jnp.bfloat16),
    }
    restored = tc.load(path, like)
    for key, value in values.items():
        np.testing.assert_array_equal(restored[key], value)
    assert restored["brain"].dtype == jnp.bfloat16 and restored["big"].dtype == np.int32


@pytest.mark.parametrize("method", ["ZIP_BZIP2", "ZIP_LZMA"])
def test_an_npz_archive_of_another_compression_loads_its_records_whole(tmp_path, method):
    import zipfile

    record = io.BytesIO()
    np.save(record, np.arange(6, dtype=">f4").reshape(2, 3))
    path = str(tmp_path / "a.npz")
    with zipfile.ZipFile(path, "w", compression=getattr(zipfile, method)) as archive:
        archive.writestr("w.npy", record.getvalue())
    restored = tc.load(path, {"w": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(restored["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert restored["w"].dtype == np.float32


def test_an_npz_object_array_is_an_error_naming_its_key(tmp_path):
    path = str(tmp_path / "a.npz")
    np.savez(path, w=np.ones(2), names=np.array(["a", None], dtype=object))
    with pytest.raises(ValueError, match=r"a\.npz.*'names' holds Python objects.*pickle"):
        tc.load(path, {"w": np.zeros(2)}, unexpected="ignore")


def test_a_zip_that_is_not_an_npz_file_is_refused(tmp_path):
    import zipfile

    path = str(tmp_path / "a.npz")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(ValueError, match=r"a\.npz is not a checkpoint.*'readme.txt'"):
        tc.load(path, {"w": np.zeros(2)})


# --------------------------------------------------------------------------------------
# flax msgpack
# --------------------------------------------------------------------------------------


def flax_mlp():
    nn = pytest.importorskip("flax.linen")

    class FlaxMLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            hidden = jax.nn.relu(nn.Dense(4)(x))  # Dense_0: named in order of creation
            return nn.Dense(2)(hidden)

    module = FlaxMLP()
    return module, module.init(jax.random.key(3), jnp.ones((1, 3)))


FLAX_RULES = {
    "params.Dense_{i}.kernel": "layers[{i}].weight",
    "params.Dense_{i}.bias": "layers[{i}].bias",
}


def test_a_flax_linen_checkpoint_loads_through_rules_and_computes_as_flax(tmp_path):
    serialization = pytest.importorskip("flax.serialization")
    module, params = flax_mlp()
    path = write(tmp_path / "params.msgpack", serialization.to_bytes(params))
    model = tc.load(path, mlp_template(), rules=FLAX_RULES)
    x = jax.random.normal(jax.random.key(0), (5, 3))
    np.testing.assert_allclose(model(x), module.apply(params, x), rtol=1e-6)


def test_a_flax_checkpoint_names_tensors_by_dotted_keys(tmp_path):
    serialization = pytest.importorskip("flax.serialization")
    _, params = flax_mlp()
    path = write(tmp_path / "params.msgpack", serialization.to_bytes(params))
    _, report = tc.load(path, {}, strict=False)
    assert sorted(report.unexpected) == [
        "params.Dense_0.bias",
        "params.Dense_0.kernel",
        "params.Dense_1.bias",
        "params.Dense_1.kernel",
    ]


def test_a_flax_state_with_numbers_lists_and_bfloat16_loads(tmp_path):
    serialization = pytest.importorskip("flax.serialization")
    state = {
        "step": 41,
        "rate": 0.5,
        "done": True,
        "shift": 1 + 2j,
        "scale": np.float32(3.0),
        "stack": [jnp.ones(2, jnp.bfloat16), jnp.arange(3)],
        "note": "ignored",
    }
    path = write(tmp_path / "state.msgpack", serialization.to_bytes(state))
    like = {
        "step": 0,
        "rate": 0.0,
        "done": False,
        "shift": 0j,
        "scale": np.float32(0),
        "stack": [jnp.zeros(2, jnp.bfloat16), jnp.zeros(3, jnp.int32)],
    }
    restored = tc.load(path, like)
    assert (restored["step"], restored["rate"], restored["done"]) == (41, 0.5, True)
    assert restored["shift"] == 1 + 2j and restored["scale"] == np.float32(3.0)
    assert restored["stack"][0].dtype == jnp.bfloat16
    np.testing.assert_array_equal(restored["stack"][1], [0, 1, 2])


def test_flax_complex_arrays_and_scalars_load_as_flax_reads_them(tmp_path):
    serialization = pytest.importorskip("flax.serialization")
    rng = np.random.default_rng(0)
    state = {
        "c64": (rng.normal(size=(2, 3)) + 1j * rng.normal(size=(2, 3))).astype(np.complex64),
        "c128": np.array([-0.0 + 1e-300j, np.inf - 2j, 3 - np.nan * 1j], np.complex128),
        "scalar": np.complex64(0.5 - 4j),
    }
    data = serialization.to_bytes(state)
    path = write(tmp_path / "complex.msgpack", data)
    like = {"c64": np.zeros((2, 3), np.complex64), "c128": np.zeros(3, np.complex128)}
    restored = tc.load(path, {**like, "scalar": np.complex64(0)})
    expected = serialization.msgpack_restore(data)
    for name in ("c64", "c128", "scalar"):
        got, want = np.asarray(restored[name]), np.asarray(expected[name])
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        assert got.tobytes() == want.tobytes(), name  # bit for bit: signs, inf and nan too


def flax_document(values: dict[str, np.ndarray], order: str) -> bytes:
    """A flax msgpack document whose arrays name their dtypes with a byte order (`>f4`),
    laid out as `serialization.to_bytes` lays out an ndarray."""
    msgpack = pytest.importorskip("msgpack")

    def ext(array: np.ndarray) -> object:
        array = np.asarray(array).astype(array.dtype.newbyteorder(order))
        triple = (list(array.shape), array.dtype.str, array.tobytes("C"))
        return msgpack.ExtType(1, msgpack.packb(triple, use_bin_type=True))

    return msgpack.packb({k: ext(v) for k, v in values.items()}, use_bin_type=True)


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(["f2", "f4", "f8", "i2", "i4", "i8", "u2", "u4", "u8", "c8", "c16"]),
    order=st.sampled_from([">", "<", "="]),
    shape=st.lists(st.integers(0, 3), max_size=3).map(tuple),
)
def test_flax_law_an_array_of_any_byte_order_loads_as_flax_reads_it(
    tmp_path_factory, dtype, order, shape
):
    serialization = pytest.importorskip("flax.serialization")
    values = (np.arange(int(np.prod(shape))) * 3 + 1).astype(dtype).reshape(shape)
    data = flax_document({"w": values}, order)
    path = write(tmp_path_factory.mktemp("order") / "m.msgpack", data)
    expected = serialization.msgpack_restore(data)["w"]
    restored = tc.load(path, {"w": np.zeros(shape, dtype)})["w"]
    assert restored.dtype == np.dtype(dtype) and restored.dtype.byteorder in "=|"
    np.testing.assert_array_equal(restored, expected)
    np.testing.assert_array_equal(restored, values)


def test_a_flax_array_written_in_chunks_loads_whole(tmp_path, monkeypatch):
    serialization = pytest.importorskip("flax.serialization")
    monkeypatch.setattr(serialization, "MAX_CHUNK_SIZE", 64)  # flax's own chunking, shrunk
    table = np.arange(200, dtype=np.float32).reshape(20, 10)
    data = serialization.to_bytes({"table": table})
    assert b"__msgpack_chunked_array__" in data
    path = write(tmp_path / "big.msgpack", data)
    np.testing.assert_array_equal(
        tc.load(path, {"table": np.zeros((20, 10), np.float32)})["table"], table
    )


def test_a_flax_nnx_state_with_integer_layer_keys_loads_and_computes_as_nnx(tmp_path):
    serialization = pytest.importorskip("flax.serialization")
    nnx = pytest.importorskip("flax.nnx")

    class NnxMLP(nnx.Module):
        def __init__(self, rngs):
            layers = [nnx.Linear(3, 4, rngs=rngs), nnx.Linear(4, 2, rngs=rngs)]
            self.layers = nnx.List(layers) if hasattr(nnx, "List") else layers
            self.steps = nnx.BatchStat(jnp.array(5))

        def __call__(self, x):
            return self.layers[1](jax.nn.relu(self.layers[0](x)))

    module = NnxMLP(nnx.Rngs(2))
    state = nnx.to_pure_dict(nnx.state(module))  # the layers keyed by the ints 0 and 1
    assert 0 in state["layers"]
    path = write(tmp_path / "nnx.msgpack", serialization.to_bytes(state))
    rules = {"layers.{i}.kernel": "layers[{i}].weight", "layers.{i}.bias": "layers[{i}].bias"}
    model, report = tc.load(path, mlp_template(), rules=rules, strict=False)
    assert report.unexpected == ("steps",) and report.missing == ()
    x = jax.random.normal(jax.random.key(1), (5, 3))
    np.testing.assert_allclose(model(x), module(x), rtol=1e-6)


def test_reading_flax_files_without_msgpack_says_what_to_install(tmp_path, monkeypatch):
    serialization = pytest.importorskip("flax.serialization")
    path = write(tmp_path / "p.msgpack", serialization.to_bytes({"w": np.ones(2)}))
    monkeypatch.setitem(sys.modules, "msgpack", None)
    with pytest.raises(ImportError, match=r"pip install 'treeclass\[msgpack\]'"):
        tc.load(path, {"w": np.zeros(2)})


# --------------------------------------------------------------------------------------
# equinox
# --------------------------------------------------------------------------------------


class EqxLinear(tc.TreeClass):
    weight: jax.Array  # [out, in], as equinox keeps it
    bias: jax.Array

    def __call__(self, x):
        return self.weight @ x + self.bias


class EqxMLP(tc.TreeClass):
    def __init__(self, sizes=(3, 4, 4, 2)):
        self.layers = tuple(
            EqxLinear(jnp.zeros((o, i)), jnp.zeros(o)) for i, o in zip(sizes[:-1], sizes[1:])
        )

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


def equinox_mlp():
    eqx = pytest.importorskip("equinox")
    return eqx, eqx.nn.MLP(3, 2, 4, 2, key=jax.random.key(5))


def test_an_equinox_file_loads_by_leaf_order_and_computes_as_equinox(tmp_path):
    eqx, reference = equinox_mlp()
    path = str(tmp_path / "mlp.eqx")
    eqx.tree_serialise_leaves(path, reference)
    model = tc.load(path, EqxMLP())
    x = jnp.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(model(x), reference(x), rtol=1e-6)
    report = tc.load(path, EqxMLP(), dry_run=True)
    assert report.sources["EqxMLP.layers[2].bias"] == ("layers.2.bias",)


def test_equinox_records_take_key_rules_too(tmp_path):
    eqx, reference = equinox_mlp()
    path = str(tmp_path / "mlp.eqx")
    eqx.tree_serialise_leaves(path, reference)
    # the template's own names, laid out [in, out]: a rule transposes equinox's weights
    rules = [("layers.{i}.weight", "layers[{i}].weight", lambda w: w.T)]
    model = tc.load(path, MLP((3, 4, 4, 2)), rules=rules)
    x = jnp.array([[0.5, -1.0, 2.0]])
    np.testing.assert_allclose(model(x)[0], reference(x[0]), rtol=1e-6)


def test_an_equinox_file_with_numbers_and_bfloat16_loads(tmp_path):
    eqx = pytest.importorskip("equinox")

    class State(eqx.Module):
        step: int
        scale: float
        w: jax.Array

    class Like(tc.TreeClass):  # the same leaves in the same order
        step: int
        scale: float
        w: jax.Array

    path = str(tmp_path / "state.eqx")
    eqx.tree_serialise_leaves(path, State(7, 0.25, jnp.arange(3, dtype=jnp.bfloat16)))
    restored = tc.load(path, Like(0, 0.0, jnp.zeros(3, jnp.bfloat16)))
    assert (restored.step, restored.scale) == (7, 0.25)
    assert restored.w.dtype == jnp.bfloat16 and restored.w.tolist() == [0, 1, 2]


def test_an_equinox_file_with_fewer_leaves_than_the_template_names_the_first_unfilled(tmp_path):
    eqx, reference = equinox_mlp()
    path = str(tmp_path / "mlp.eqx")
    eqx.tree_serialise_leaves(path, reference)
    with pytest.raises(ValueError, match=r"holds 6 array.*7 .*nothing for tree\[1\] and after"):
        tc.load(path, (EqxMLP(), jnp.zeros(1)))


def test_an_equinox_file_of_a_different_model_names_the_first_path_that_differs(tmp_path):
    eqx, reference = equinox_mlp()
    path = str(tmp_path / "mlp.eqx")
    eqx.tree_serialise_leaves(path, reference)
    with pytest.raises(ValueError, match=r"holds 6 array.*4 .*EqxMLP.layers\[1\].weight: "):
        tc.load(path, EqxMLP((3, 4, 2)))


def test_an_equinox_leaf_of_another_shape_is_a_mismatch_at_its_path(tmp_path):
    eqx, reference = equinox_mlp()
    path = str(tmp_path / "mlp.eqx")
    eqx.tree_serialise_leaves(path, reference)
    _, report = tc.load(path, EqxMLP((3, 4, 5, 2)), strict=False)
    assert report.mismatched[:2] == ("EqxMLP.layers[1].weight", "EqxMLP.layers[1].bias")


# --------------------------------------------------------------------------------------
# Choosing the format
# --------------------------------------------------------------------------------------


def flax_bytes(tree) -> bytes:
    return pytest.importorskip("flax.serialization").to_bytes(tree)


def equinox_bytes(tree) -> bytes:
    eqx = pytest.importorskip("equinox")
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, tree)
    return buffer.getvalue()


def npz_bytes(tree) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **tree)
    return buffer.getvalue()


def safetensors_bytes(tree) -> bytes:
    from safetensors.numpy import save

    return save(tree)


WRITERS = {
    "safetensors": safetensors_bytes,
    "npz": npz_bytes,
    "flax": flax_bytes,
    "equinox": equinox_bytes,
}


@pytest.mark.parametrize("format", list(WRITERS))
def test_a_file_without_an_extension_is_told_by_its_first_bytes(tmp_path, format):
    tree = {"w": np.arange(3, dtype=np.float32)}
    path = write(tmp_path / "checkpoint_100", WRITERS[format](tree))
    restored = tc.load(path, {"w": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(restored["w"], tree["w"])
    restored = tc.load(path, {"w": np.zeros(3, np.float32)}, format=format)
    np.testing.assert_array_equal(restored["w"], tree["w"])


def test_format_names_the_reader_whatever_the_file_is_called(tmp_path):
    path = write(tmp_path / "weights.bin", npz_bytes({"w": np.ones(2)}))
    assert tc.load(path, {"w": np.zeros(2)}, format="npz")["w"].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="not a checkpoint tc.load can read"):
        tc.load(path, {"w": np.zeros(2)}, format="safetensors")


def test_an_unknown_format_or_file_is_an_error_listing_the_formats(tmp_path):
    path = write(tmp_path / "weights.pt", b"\x80\x02}q\x00.")  # a pickle
    with pytest.raises(ValueError, match=r"weights\.pt.*'safetensors', 'sharded', 'npz'"):
        tc.load(path, {"w": np.zeros(2)})
    with pytest.raises(ValueError, match=r"format= takes one of .*'equinox'.*got 'torch'"):
        tc.load(path, {"w": np.zeros(2)}, format="torch")


@pytest.mark.parametrize("format", ["npz", "flax", "equinox", "torch", 3])
def test_save_refuses_a_format_it_does_not_write_before_writing(tmp_path, format):
    path = tmp_path / "m.out"
    with pytest.raises(ValueError, match=r"format= takes one of 'safetensors', 'sharded'") as info:
        tc.save(path, {"w": np.ones(2)}, format=format)
    if format in ("npz", "flax", "equinox"):
        assert f"{format} is a format tc.load reads only" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_save_format_mirrors_load_format(tmp_path):
    tree = {"w": np.arange(40, dtype=np.float32), "b": np.ones(40, np.float32)}
    tc.save(tmp_path / "checkpoint_100", tree, format="safetensors")  # a name without a suffix
    assert tc.is_tree_equal(tc.load(tmp_path / "checkpoint_100", tree, format="safetensors"), tree)
    index = tmp_path / "model.safetensors.index.json"
    tc.save(index, tree, format="sharded", max_shard_size="200B")
    assert tc.is_tree_equal(tc.load(index, tree, format="sharded"), tree)
    with pytest.raises(ValueError, match="format='sharded' needs max_shard_size="):
        tc.save(index, tree, format="sharded")
    with pytest.raises(ValueError, match="format='safetensors' writes one file"):
        tc.save(tmp_path / "m.safetensors", tree, format="safetensors", max_shard_size="1GB")


@pytest.mark.parametrize(
    "name, format", [("m.npz", "npz"), ("M.EQX", "equinox"), ("flax_model.msgpack", "flax")]
)
def test_save_refuses_a_name_of_a_format_it_does_not_write(tmp_path, name, format):
    # before, a safetensors file was written under that name, which tc.load then opened with
    # the named format's reader and called corrupted
    path = tmp_path / name
    single = str(path)[: -len(name.split(".")[-1])] + "safetensors"
    with pytest.raises(ValueError) as caught:
        tc.save(path, {"w": np.ones(2)})
    assert f"tc.save cannot write {path}" in str(caught.value)
    assert f"in the {format} format, which tc.load reads but tc.save does not write" in str(
        caught.value
    )
    assert f"tc.save({single!r}, tree)" in str(caught.value)
    assert list(tmp_path.iterdir()) == []
    tc.save(single, {"w": np.ones(2)})  # the suggested name saves and loads back
    assert tc.is_tree_equal(tc.load(single, {"w": np.zeros(2)}), {"w": np.ones(2)})


@pytest.mark.parametrize(
    "options",
    [{"rules": [("dense.w", "layer.w")]}, {"max_shard_size": "1MB"}, {"metadata": {"a": "b"}}],
    ids=["export", "sharded", "metadata"],
)
def test_every_save_refuses_a_read_only_name_before_its_own_checks(tmp_path, options):
    # the export path (rules=) and a shard limit plan nothing for a name they cannot write
    model = {"layer": {"w": jnp.ones((2, 3))}, "frozen": tc.freeze(jnp.zeros(2))}
    with pytest.raises(ValueError, match="in the npz format, which tc.load reads"):
        tc.save(tmp_path / "model.npz", model, **options)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["model.safetensors.index.json", "model.index.json"])
def test_save_to_an_index_name_without_a_shard_size_is_refused_with_both_fixes(tmp_path, name):
    # before, one safetensors file was written under the index's name, unreadable as an index
    path = tmp_path / name
    with pytest.raises(ValueError, match="a sharded checkpoint's index") as caught:
        tc.save(path, {"w": np.ones(2)})
    assert f"tc.save({str(path)!r}, tree, max_shard_size='5GB')" in str(caught.value)
    assert f"tc.save({str(tmp_path / 'model.safetensors')!r}, tree)" in str(caught.value)
    assert list(tmp_path.iterdir()) == []
    tc.save(path, {"w": np.ones(2)}, max_shard_size="5GB")
    assert tc.is_tree_equal(tc.load(path, {"w": np.zeros(2)}), {"w": np.ones(2)})


# --------------------------------------------------------------------------------------
# Every reader: corrupted input is one ValueError naming the file; dry runs read no bytes
# --------------------------------------------------------------------------------------

FLAGS = [True, False] * 8  # a pattern no header holds


def written(tmp_path, format: str, tree: dict) -> str:
    """`tree` written by the real writer of `format` (a sharded index for "sharded")."""
    if format == "sharded":
        return write_repository(tmp_path, tree, [list(tree)])
    names = {
        "safetensors": "m.safetensors",
        "npz": "m.npz",
        "flax": "m.msgpack",
        "equinox": "m.eqx",
    }
    return write(tmp_path / names[format], WRITERS[format](tree))


def data_file(path: str) -> str:
    """The file holding the tensor bytes (a sharded checkpoint's shard)."""
    if path.endswith(".index.json"):
        return os.path.join(os.path.dirname(path), "model-00001-of-00001.safetensors")
    return path


@pytest.mark.parametrize("format", [*WRITERS, "sharded"])
def test_a_dry_run_reads_no_tensor_bytes(tmp_path, format):
    path = written(tmp_path, format, {"flags": np.array(FLAGS)})
    target = data_file(path)
    raw = bytearray(pathlib.Path(target).read_bytes())
    at = raw.find(bytes(FLAGS))
    raw[at + 1] = 7  # a bool byte no reader may accept: only reading the data finds it
    write(target, bytes(raw))
    like = {"flags": np.zeros(len(FLAGS), bool)}
    report = tc.load(path, like, dry_run=True)
    assert report.messages == () and report.restored == ("tree['flags']",)
    with pytest.raises(ValueError, match=os.path.basename(path)):
        tc.load(path, like)


@pytest.mark.parametrize("format", [*WRITERS, "sharded"])
def test_a_truncated_file_is_a_value_error_naming_it(tmp_path, format):
    tree = {"a": np.arange(6, dtype=np.float32), "b": np.ones((2, 2), np.int64)}
    path = written(tmp_path, format, tree)
    target = data_file(path)
    whole = pathlib.Path(target).read_bytes()
    like = {k: np.zeros_like(v) for k, v in tree.items()}
    for cut in sorted({0, 1, 5, 8, 9, 20, len(whole) // 2, len(whole) - 9, len(whole) - 1}):
        write(target, whole[:cut])
        with pytest.raises(ValueError, match=os.path.basename(target)):
            tc.load(path, like)


@pytest.mark.parametrize("format", [*WRITERS, "sharded"])
def test_garbage_is_a_value_error_naming_the_file(tmp_path, format):
    path = written(tmp_path, format, {"a": np.arange(6, dtype=np.float32)})
    target = data_file(path)
    size = os.path.getsize(target)
    head = {"safetensors": struct.pack("<Q", 40), "npz": b"PK\x03\x04", "flax": b"\x81\xa1a",
            "equinox": b"\x93NUMPY\x01\x00", "sharded": struct.pack("<Q", 40)}[format]  # fmt: skip
    write(target, head + bytes(range(256)) * (size // 256 + 1))
    with pytest.raises(ValueError, match=os.path.basename(target)):
        tc.load(path, {"a": np.zeros(6, np.float32)})


def test_a_malformed_index_is_a_value_error_naming_it(tmp_path):
    path = str(tmp_path / "m.safetensors.index.json")
    for text in ("{", "[]", '{"weight_map": 3}', '{"weight_map": {}, "metadata": []}'):
        write(path, text.encode())
        with pytest.raises(ValueError, match=r"m\.safetensors\.index\.json is not a checkpoint"):
            tc.load(path, {"a": np.zeros(1)})


# --------------------------------------------------------------------------------------
# Ranges: what a template sharded over several devices reads
# --------------------------------------------------------------------------------------


def range_fixtures(tmp_path, values: dict[str, np.ndarray]) -> dict[str, str]:
    """One file per reader and layout, each holding `values` (`f32` and `i32`)."""
    eqx = pytest.importorskip("equinox")
    serialization = pytest.importorskip("flax.serialization")
    files = {}
    files["npz"] = str(tmp_path / "a.npz")
    np.savez(files["npz"], **values)
    files["npz compressed"] = str(tmp_path / "c.npz")
    np.savez_compressed(files["npz compressed"], **values)
    files["npz fortran big-endian"] = str(tmp_path / "f.npz")
    odd = {
        "f32": np.asfortranarray(values["f32"]),
        "i32": values["i32"].astype(">i4"),
    }
    np.savez(files["npz fortran big-endian"], **odd)
    files["equinox"] = str(tmp_path / "m.eqx")
    eqx.tree_serialise_leaves(files["equinox"], values)
    files["flax"] = str(tmp_path / "m.msgpack")
    write(files["flax"], serialization.to_bytes(values))
    chunked = serialization.MAX_CHUNK_SIZE
    serialization.MAX_CHUNK_SIZE = values["f32"].nbytes // 3 - 4  # flax's chunking, shrunk
    try:
        files["flax chunked"] = write(tmp_path / "k.msgpack", serialization.to_bytes(values))
    finally:
        serialization.MAX_CHUNK_SIZE = chunked
    files["sharded"] = write_repository(tmp_path, values, [["f32"], ["i32"]])
    files["flax big-endian"] = write(tmp_path / "b.msgpack", flax_document(values, ">"))
    return files


RANGE_VALUES = {
    "f32": np.arange(8 * 6 * 4, dtype=np.float32).reshape(8, 6, 4),
    "i32": np.arange(24, dtype=np.int32).reshape(4, 6),
}


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_source_law_a_range_is_those_bytes_of_the_whole_tensor(tmp_path_factory, data):
    from treeclass._checkpoint.formats._formats import open_source  # the source protocol itself

    files = range_fixtures(tmp_path_factory.mktemp("ranges"), RANGE_VALUES)
    name = data.draw(st.sampled_from(sorted(files)))
    key = data.draw(st.sampled_from(sorted(RANGE_VALUES)))
    size = RANGE_VALUES[key].nbytes
    start = data.draw(st.integers(0, size))
    stop = data.draw(st.integers(start, size + 8))
    source = open_source(files[name], RANGE_VALUES)
    try:
        whole = source.read(key)
        np.testing.assert_array_equal(whole, RANGE_VALUES[key])
        expected = RANGE_VALUES[key].astype(RANGE_VALUES[key].dtype.newbyteorder("<"))
        expected = expected.reshape(-1).view(np.uint8)[start:stop]
        np.testing.assert_array_equal(source.read_range(key, start, stop), expected)
    finally:
        source.close()


_SHARDED_TEMPLATE_LOAD = """
import json, os, pathlib, sys
flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import treeclass as tc

def rchar():
    text = pathlib.Path("/proc/self/io").read_text()
    return int(dict(line.split(": ") for line in text.splitlines())["rchar"])

files = json.loads(sys.argv[1])
f32 = np.arange(64 * 48 * 32, dtype=np.float32).reshape(64, 48, 32)
i32 = np.arange(32 * 48, dtype=np.int32).reshape(32, 48)
mesh = jax.make_mesh((2, 4), ("a", "b"))
on = lambda spec: NamedSharding(mesh, spec)
results = {}
for name, path in files.items():
    try:
        like = {
            "f32": jax.ShapeDtypeStruct(f32.shape, jnp.float32, sharding=on(P("a", None, "b"))),
            "i32": jax.ShapeDtypeStruct(i32.shape, jnp.int32, sharding=on(P("b"))),
        }
        before = rchar()
        got = tc.load(path, like)
        read = rchar() - before
        np.testing.assert_array_equal(np.asarray(got["f32"]), f32)
        np.testing.assert_array_equal(np.asarray(got["i32"]), i32)
        assert got["f32"].sharding == like["f32"].sharding
        # each tensor's bytes about once, not once per range of rows
        assert read < 2 * (f32.nbytes + i32.nbytes) + 128 * 1024, read
        results[name] = "ok"
    except Exception as error:
        results[name] = repr(error)
print(json.dumps(results))
"""


@needs_read_counts
def test_a_template_sharded_over_devices_loads_from_every_reader_reading_bytes_once(tmp_path):
    import subprocess

    values = {
        "f32": np.arange(64 * 48 * 32, dtype=np.float32).reshape(64, 48, 32),
        "i32": np.arange(32 * 48, dtype=np.int32).reshape(32, 48),
    }
    files = range_fixtures(tmp_path, values)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    root = str(pathlib.Path(__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _SHARDED_TEMPLATE_LOAD, json.dumps(files)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results == dict.fromkeys(files, "ok")


_BOTH_PATHS = """
import json, os, sys
flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import treeclass as tc

files = json.loads(sys.argv[1])
mesh = jax.make_mesh((8,), ("a",))
results = {}
for name, path in files.items():
    outcomes = []
    for sharding in (None, NamedSharding(mesh, P("a"))):
        like = {
            "f32": jax.ShapeDtypeStruct((64, 48), jnp.float32, sharding=sharding),
            "i32": jax.ShapeDtypeStruct((32, 48), jnp.int32, sharding=sharding),
        }
        try:
            got = tc.load(path, like)
            outcomes.append({k: np.asarray(v).tolist() for k, v in got.items()})
        except ValueError as error:
            outcomes.append("ValueError: " + str(error))
    results[name] = outcomes
print(json.dumps(results))
"""


def _flip_stored_data_bit(path: str) -> None:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("f32.npy")
    raw = bytearray(pathlib.Path(path).read_bytes())
    name, extra = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    raw[info.header_offset + 30 + name + extra + 128 + 40] ^= 0x10  # past its npy header
    pathlib.Path(path).write_bytes(bytes(raw))


def test_a_template_sharded_over_devices_makes_the_checks_a_plain_one_makes(tmp_path):
    import subprocess

    values = {
        "f32": np.arange(64 * 48, dtype=np.float32).reshape(64, 48) / 7,
        "i32": np.arange(32 * 48, dtype=np.int32).reshape(32, 48) - 500,
    }
    files = {
        "flax big-endian": write(tmp_path / "b.msgpack", flax_document(values, ">")),
        "npz with a flipped data bit": str(tmp_path / "d.npz"),
    }
    np.savez(files["npz with a flipped data bit"], **values)
    _flip_stored_data_bit(files["npz with a flipped data bit"])
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    root = str(pathlib.Path(__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _BOTH_PATHS, json.dumps(files)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, sharded = results["flax big-endian"]
    assert plain == sharded == {k: v.tolist() for k, v in values.items()}
    plain, sharded = results["npz with a flipped data bit"]
    assert plain == sharded
    assert "d.npz" in plain and "does not match its CRC-32" in plain


def test_a_malformed_treeclass_document_is_named_with_the_format_that_holds_it(tmp_path):
    tree = sharded_tree()
    path = str(tmp_path / "model.safetensors.index.json")
    tc.save(path, tree, max_shard_size=100)
    index = read_json(path)
    index["metadata"]["treeclass"] = "{not json"
    with open(path, "w") as file:
        json.dump(index, file)
    with pytest.raises(ValueError, match="treeclass metadata is not valid JSON") as info:
        tc.load(path, tree)
    assert "sharded safetensors index" in str(info.value) and path in str(info.value)


# --------------------------------------------------------------------------------------
# Damaged archives: every way numpy's or zipfile's parsers fail is one ValueError
# --------------------------------------------------------------------------------------


def _unclosed_shape(raw: bytearray, info) -> None:
    at = raw.find(b"'shape': (6,)")
    raw[at : at + 13] = b"'shape': (6, "  # numpy's header tokenizer meets an open bracket


def _unknown_zip_version(raw: bytearray, info) -> None:
    at = raw.find(b"PK\x01\x02")  # the central directory's first entry
    raw[at + 6 : at + 8] = b"\xff\x00"  # "version needed to extract": 25.5


def _directory_points_before_the_file(raw: bytearray, info) -> None:
    at = raw.rfind(b"PK\x05\x06")  # the end record: the directory's offset at 16
    offset = struct.unpack("<I", raw[at + 16 : at + 20])[0]
    raw[at + 16 : at + 20] = struct.pack("<I", offset + 200)


def _invalid_deflate_block(raw: bytearray, info) -> None:
    name, extra = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    raw[info.header_offset + 30 + name + extra] = 0xFF  # a block of the reserved type


@pytest.mark.parametrize(
    ("writer", "damage"),
    [
        (np.savez, _unclosed_shape),  # a compressed record's header is not text in the file
        *((w, d) for w in (np.savez, np.savez_compressed)
          for d in (_unknown_zip_version, _directory_points_before_the_file)),
        (np.savez_compressed, _invalid_deflate_block),  # a stored record has no stream
    ],
)  # fmt: skip
def test_a_damaged_npz_archive_is_a_value_error_naming_it(tmp_path, writer, damage):
    import zipfile

    buffer = io.BytesIO()
    writer(buffer, w=np.arange(6, dtype=np.float32))
    raw = bytearray(buffer.getvalue())
    (info,) = zipfile.ZipFile(io.BytesIO(bytes(raw))).infolist()
    damage(raw, info)
    path = write(tmp_path / "damaged.npz", bytes(raw))
    with pytest.raises(ValueError, match=r"damaged\.npz is not a checkpoint"):
        tc.load(path, {"w": np.zeros(6, np.float32)})


def test_an_equinox_record_with_an_unclosed_header_is_a_value_error_naming_it(tmp_path):
    raw = bytearray(equinox_bytes({"w": np.arange(6, dtype=np.float32)}))
    at = raw.find(b"'shape': (6,)")
    raw[at : at + 13] = b"'shape': (6, "
    path = write(tmp_path / "damaged.eqx", bytes(raw))
    with pytest.raises(ValueError, match=r"damaged\.eqx is not a checkpoint.*record 0"):
        tc.load(path, {"w": np.zeros(6, np.float32)})


def test_a_folder_passes_over_the_indexes_of_other_libraries_shards(repository, tmp_path):
    path, _ = repository
    for name in ("pytorch_model.bin.index.json", "flax_model.msgpack.index.json"):
        index = {"metadata": {"total_size": 8}, "weight_map": {"w": "shard-00001-of-00001.bin"}}
        (tmp_path / name).write_text(json.dumps(index))
    by_index = tc.load(path, mlp_template(), rules=TORCH_RULES)
    assert_tree_equal(tc.load(tmp_path, mlp_template(), rules=TORCH_RULES), by_index)


def test_a_folder_with_one_safetensors_file_and_a_pytorch_index_loads_the_file(tmp_path):
    save_file({"w": np.arange(2, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    index = {"metadata": {"total_size": 8}, "weight_map": {"w": "pytorch_model.bin"}}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    restored = tc.load(tmp_path, {"w": jnp.zeros(2)})
    np.testing.assert_array_equal(restored["w"], [0.0, 1.0])


def test_a_registered_format_is_read_by_name_by_suffix_and_by_format(tmp_path, monkeypatch):
    # a format is one module: a reader satisfying the source protocol, and its row
    from treeclass._checkpoint.files import _source
    from treeclass._checkpoint.files._source import FileSource, Format, TensorInfo

    class JsonArrays(FileSource):
        format = "json-arrays"

        def __init__(self, file, location):
            super().__init__(file, location)
            self.arrays = {k: np.asarray(v, np.float32) for k, v in json.load(file).items()}

        def keys(self):
            return list(self.arrays)

        def info(self, key):
            a = self.arrays[key]
            return TensorInfo(a.dtype.name, a.shape, a.nbytes)

        def read(self, key):
            return self.arrays[key]

        def read_range(self, key, start, stop):
            return self.arrays[key].reshape(-1).view(np.uint8)[start:stop]

    monkeypatch.setattr(_source, "_REGISTERED", dict(_source._REGISTERED))  # (undone after)
    row = Format(
        "json-arrays",
        (".arrays.json",),
        lambda head, size: head[:2] == b'{"',
        lambda path, like: JsonArrays(open(path, "rb"), path),
    )
    _source.register_format(row)
    path = tmp_path / "w.arrays.json"
    path.write_text(json.dumps({"w": [1.0, 2.0]}))
    assert tc.load(path, {"w": jnp.zeros(2)})["w"].tolist() == [1.0, 2.0]
    assert tc.load(path, {"w": jnp.zeros(2)}, format="json-arrays")["w"].tolist() == [1.0, 2.0]
    (tmp_path / "w.txt").write_text(json.dumps({"w": [3.0, 4.0]}))  # told by its first bytes
    assert tc.load(tmp_path / "w.txt", {"w": jnp.zeros(2)})["w"].tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match="format= takes one of 'safetensors', 'sharded'"):
        tc.save(tmp_path / "out", {"w": jnp.ones(2)}, format="json-arrays")  # it has no writer
    with pytest.raises(ValueError, match="named 'json-arrays' is registered already"):
        _source.register_format(row)
    with pytest.raises(ValueError, match=r"claims '\.npz', which names the 'npz' format"):
        _source.register_format(row._replace(name="other", suffixes=(".npz",)))


def test_every_module_of_the_formats_folder_is_imported_and_every_format_comes_from_one():
    # a new format is one module in the folder: nothing else imports or lists it
    from treeclass._checkpoint import formats as folder
    from treeclass._checkpoint.files._source import formats

    here = pathlib.Path(folder.__file__).parent
    modules = sorted(p.stem for p in here.glob("_*.py") if p.name != "__init__.py")
    assert {"_safetensors", "_sharded", "_npz", "_flax", "_equinox"} <= set(modules)
    assert all(f"{folder.__name__}.{m}" in sys.modules for m in modules)
    origins = {row.name: row.sniff.__module__ for row in formats()}
    assert all(o.startswith(f"{folder.__name__}._") for o in origins.values()), origins
    assert sorted(origins) == ["equinox", "flax", "npz", "safetensors", "sharded"]
