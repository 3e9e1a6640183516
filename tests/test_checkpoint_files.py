"""Checkpoint files as untrusted input, and saving that keeps what the user had.

Reading a file never hangs, recurses without bound or raises anything but `ValueError`
(bad bytes) or `OSError` (I/O); every error names the file. Everything `tc.save` writes is
valid safetensors that the reference reader accepts.
"""

from __future__ import annotations

import errno
import json
import os
import random
import stat
import struct
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treeclass as tc

# a non-strict load that kept values the file holds under another name warns; expected
LOSSY = pytest.mark.filterwarnings("ignore:.*under another name, dtype or layout:UserWarning")


class Tagged(tc.TreeClass):
    w: jax.Array
    tag: Any = tc.field(default="", static=True)


def read_header(path: Any) -> tuple[dict, bytes]:
    with open(path, "rb") as file:
        raw = file.read()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def write_raw_header(path: Any, text: bytes, data: bytes = b"") -> None:
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text + data)


def write_header(path: Any, header: dict, data: bytes) -> None:
    write_raw_header(path, json.dumps(header).encode(), data)


def _document(header: dict) -> dict:
    return json.loads(header["__metadata__"]["treeclass"])


# ------------------------------------------------------------------------------------------
# bytes a dtype does not use
# ------------------------------------------------------------------------------------------


def test_bool_bytes_other_than_0_and_1_are_refused_naming_the_tensor_and_file(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"mask": np.array([True, False, True])})
    header, data = read_header(path)
    write_header(path, header, b"\x01\x00\x07")
    with pytest.raises(ValueError, match=r"(?s)m\.safetensors.*'mask'.*byte 7.*tree\['mask'\]"):
        tc.load(path, {"mask": np.zeros(3, bool)})


def test_bool_bytes_of_a_foreign_file_are_checked_too(tmp_path):
    from safetensors.numpy import save_file

    path = str(tmp_path / "foreign.safetensors")
    save_file({"m": np.array([True, False])}, path)
    header, data = read_header(path)
    write_header(path, header, b"\x02" + data[1:])
    with pytest.raises(ValueError, match="0 or 1"):
        tc.load(path, {"m": jnp.zeros(2, bool)})


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "float4_e2m1fn"])
def test_sub_byte_dtypes_with_high_bits_set_are_refused(tmp_path, name):
    dtype = np.dtype(getattr(ml_dtypes, name))
    path = tmp_path / "m.safetensors"
    tree = {"x": np.zeros(3, dtype)}
    tc.save(path, tree)
    header, data = read_header(path)
    write_header(path, header, data[:1] + b"\xf0" + data[2:])
    with pytest.raises(ValueError, match=rf"'x' \({name}\) holds the byte 240 at element 1"):
        tc.load(path, tree)


def test_valid_bools_and_int4s_load(tmp_path):
    tree = {"b": np.array([True, False]), "i": np.array([-8, 7, -1], ml_dtypes.int4)}
    tc.save(tmp_path / "m.safetensors", tree)
    restored = tc.load(tmp_path / "m.safetensors", tree)
    assert restored["b"].tolist() == [True, False] and restored["i"].tolist() == [-8, 7, -1]


# ------------------------------------------------------------------------------------------
# what we write is valid safetensors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tree",
    [
        {"\ud800": jnp.ones(1)},
        {"a": {"b\udcff": jnp.ones(1)}},
        {"s\ud800": "text"},
        {"w": jnp.ones(1), "s": tc.freeze("lone \udc80 surrogate")},
        {"w": jnp.ones(1), "s": tc.freeze(("ok", "bad \ud801"))},
        {"m": Tagged(jnp.ones(1), tag="static \udfff")},
        {"m": Tagged(jnp.ones(1), tag=(abs, "a part \ud800"))},
        {"m": [Tagged(jnp.ones(1), tag=("deep", ("\ud800",)))]},
    ],
)
def test_names_and_strings_that_are_not_valid_utf8_are_refused_on_save(tmp_path, tree):
    path = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match=r"m\.safetensors.*tree\[.*not valid UTF-8"):
        tc.save(path, tree)
    assert os.listdir(tmp_path) == []


def test_unicode_names_and_strings_are_read_back_by_the_reference_reader(tmp_path):
    from safetensors import safe_open

    path = str(tmp_path / "m.safetensors")
    tree = {"é": jnp.ones(1), "日本": {"𝔁": jnp.zeros(2)}, "s": tc.freeze("ünï")}
    tc.save(path, tree)
    with safe_open(path, framework="np") as file:
        assert sorted(file.keys()) == sorted(["日本.𝔁", "é"])
    restored = tc.load(path, tree)
    assert tc.unfreeze(restored["s"]) == "ünï"


# ------------------------------------------------------------------------------------------
# strict JSON: duplicates, non-string metadata, constants, surrogate escapes
# ------------------------------------------------------------------------------------------

_ENTRY = '"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'


_REFUSED_HEADERS = [
    pytest.param(text, reason)
    for text, reason in [
        ("{" + _ENTRY + "," + _ENTRY + "}", "'a' appears twice"),
        ('{"__metadata__":{"x":"1"},"__metadata__":{"x":"1"},' + _ENTRY + "}", "twice"),
        ('{"__metadata__":{"x":"1","x":"2"},' + _ENTRY + "}", "'x' appears twice"),
        ('{"__metadata__":{"x":1},' + _ENTRY + "}", "maps 'x' to a int"),
        ('{"__metadata__":{"x":["y"]},' + _ENTRY + "}", "maps 'x' to a list"),
        ('{"__metadata__":{"x":null},' + _ENTRY + "}", "maps 'x' to a NoneType"),
        ('{"__metadata__":[],' + _ENTRY + "}", "__metadata__ is not a JSON object"),
        ('{"__metadata__":0,' + _ENTRY + "}", "__metadata__ is not a JSON object"),
        ('{"__metadata__":"",' + _ENTRY + "}", "__metadata__ is not a JSON object"),
        ('{"__metadata__":false,' + _ENTRY + "}", "__metadata__ is not a JSON object"),
        ('{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "'dtype' appears"),
        ('{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', "NaN is not JSON"),
        ('{"\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "not valid UTF-8"),
    ]
]


@pytest.mark.parametrize("text, reason", _REFUSED_HEADERS)
def test_headers_the_reference_reader_refuses_are_refused(tmp_path, text, reason):
    path = tmp_path / "m.safetensors"
    write_raw_header(path, text.encode(), b"\x00" * 4)
    with pytest.raises(ValueError, match=reason) as info:
        tc.load(path, {"a": jnp.ones(1)}, strict=False)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("text", ['{"__metadata__":null,' + _ENTRY + "}", "{" + _ENTRY + "}"])
def test_a_header_without_metadata_loads_as_the_reference_reader_reads_it(tmp_path, text):
    from safetensors import safe_open

    path = tmp_path / "m.safetensors"
    write_raw_header(path, text.encode(), np.ones(1, np.float32).tobytes())
    with safe_open(str(path), framework="np") as file:
        assert list(file.keys()) == ["a"]
    assert tc.load(path, {"a": jnp.zeros(1)})["a"].tolist() == [1.0]


@pytest.mark.parametrize("part", ["values", "tensors", "objects"])
def test_duplicate_keys_inside_our_metadata_are_refused(tmp_path, part):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"a": jnp.ones(1), "s": "x", "f": tc.freeze(abs)})
    header, data = read_header(path)
    text = header["__metadata__"]["treeclass"]
    inner = json.dumps(_document(header)[part], separators=(",", ":"))[1:-1]
    header["__metadata__"]["treeclass"] = text.replace(inner, inner + "," + inner, 1)
    write_header(path, header, data)
    with pytest.raises(ValueError, match="appears twice"):
        tc.load(path, {"a": jnp.ones(1), "s": "x", "f": tc.freeze(abs)}, strict=False)


def _rewrite_document(path: Any, change: Any) -> None:
    header, data = read_header(path)
    document = _document(header)
    change(document)
    header["__metadata__"]["treeclass"] = json.dumps(document)
    write_header(path, header, data)


@pytest.mark.parametrize(
    "value",
    [
        {"float": "nan:abcd"},
        {"float": "nan:"},
        {"float": "nan:" + "00" * 9},
        {"float": "nan:zz"},
        {"float": "1.5"},
        {"float": 5},
        {"float": ["inf"]},
        {"complex": [1.0]},
        {"complex": ["1", 2.0]},
        {"tuple": 3},
        {"tuple": [1], "float": "inf"},
        {"list": [1]},
    ],
)
def test_malformed_values_in_our_metadata_are_value_errors_naming_the_file(tmp_path, value):
    path = tmp_path / "m.safetensors"
    tree = {"a": jnp.ones(1), "s": float("nan")}
    tc.save(path, tree)
    _rewrite_document(path, lambda document: document["values"]["s"].update(value=value))
    with pytest.raises(ValueError, match=r"m\.safetensors.*value in its treeclass metadata"):
        tc.load(path, tree, strict=False)


@pytest.mark.parametrize("weak", [1, 0, "yes", None, [True]])
def test_a_weak_flag_that_is_not_a_bool_is_refused(tmp_path, weak):
    path = tmp_path / "m.safetensors"
    tree = {"a": jnp.asarray(0.5)}
    tc.save(path, tree)
    _rewrite_document(path, lambda document: document["tensors"]["a"].update(weak=weak))
    with pytest.raises(ValueError, match=r"m\.safetensors.*record of tensor 'a' is malformed"):
        tc.load(path, tree)


def test_a_name_given_to_a_tensor_and_a_value_is_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"a": jnp.ones(1), "s": "x"})
    header, data = read_header(path)
    document = _document(header)
    document["values"]["a"] = {"kind": "leaf", "value": 1}
    header["__metadata__"]["treeclass"] = json.dumps(document)
    write_header(path, header, data)
    with pytest.raises(ValueError, match="'a' is given to two values"):
        tc.load(path, {"a": jnp.ones(1), "s": "x"})


# ------------------------------------------------------------------------------------------
# only regular files; bounded headers and nesting
# ------------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_refused_without_blocking(tmp_path):
    path = tmp_path / "pipe.safetensors"
    os.mkfifo(path)
    with pytest.raises(ValueError, match=r"only regular files.*pipe\.safetensors is a named pipe"):
        tc.load(path, {"a": jnp.ones(1)})


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        tc.load(tmp_path, {"a": jnp.ones(1)})


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused():
    with pytest.raises(ValueError, match="/dev/zero is a character device"):
        tc.load("/dev/zero", {"a": jnp.ones(1)})


def test_a_link_to_a_checkpoint_loads(tmp_path):
    tc.save(tmp_path / "m.safetensors", {"a": jnp.ones(1)})
    os.symlink(tmp_path / "m.safetensors", tmp_path / "latest.safetensors")
    assert tc.load(tmp_path / "latest.safetensors", {"a": jnp.zeros(1)})["a"].tolist() == [1.0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_link_to_a_named_pipe_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    os.symlink(tmp_path / "pipe", tmp_path / "link.safetensors")
    with pytest.raises(ValueError, match=r"link\.safetensors is a named pipe"):
        tc.load(tmp_path / "link.safetensors", {"a": jnp.ones(1)})


def test_a_link_to_a_folder_is_refused(tmp_path):
    os.mkdir(tmp_path / "folder")
    os.symlink(tmp_path / "folder", tmp_path / "link.safetensors")
    with pytest.raises(ValueError, match=r"link\.safetensors is a folder"):
        tc.load(tmp_path / "link.safetensors", {"a": jnp.ones(1)})


def test_a_chain_of_links_to_a_checkpoint_loads(tmp_path):
    tc.save(tmp_path / "m.safetensors", {"a": jnp.ones(1)})
    os.symlink(tmp_path / "m.safetensors", tmp_path / "one")
    os.symlink("one", tmp_path / "two.safetensors")  # relative, too
    assert tc.load(tmp_path / "two.safetensors", {"a": jnp.zeros(1)})["a"].tolist() == [1.0]


def test_a_save_onto_a_link_writes_through_it_and_keeps_the_link(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    tc.save(folder / "step100.safetensors", {"a": jnp.zeros(1)})
    os.symlink(os.path.join("runs", "step100.safetensors"), tmp_path / "latest.safetensors")
    tc.save(tmp_path / "latest.safetensors", {"a": jnp.ones(1)})
    assert os.path.islink(tmp_path / "latest.safetensors")
    assert sorted(os.listdir(folder)) == ["step100.safetensors"]  # no temporary left
    assert tc.load(folder / "step100.safetensors", {"a": jnp.zeros(1)})["a"].tolist() == [1.0]
    os.symlink(tmp_path / "new.safetensors", tmp_path / "next.safetensors")  # dangling
    tc.save(tmp_path / "next.safetensors", {"a": jnp.full(1, 2.0)})
    assert os.path.islink(tmp_path / "next.safetensors")
    assert tc.load(tmp_path / "new.safetensors", {"a": jnp.zeros(1)})["a"].tolist() == [2.0]


def test_a_dangling_link_is_an_os_error_naming_it(tmp_path):
    os.symlink(tmp_path / "gone.safetensors", tmp_path / "link.safetensors")
    with pytest.raises(FileNotFoundError, match=r"link\.safetensors"):
        tc.load(tmp_path / "link.safetensors", {"a": jnp.ones(1)})


def test_a_missing_file_is_an_os_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        tc.load(tmp_path / "nothing.safetensors", {"a": jnp.ones(1)})


def test_a_deeply_nested_header_is_a_value_error(tmp_path):
    path = tmp_path / "m.safetensors"
    write_raw_header(path, b"[" * 100_000)
    with pytest.raises(ValueError, match="limit of 64 levels"):
        tc.load(path, {"a": jnp.ones(1)})
    write_raw_header(path, b'{"a":' * 70 + b"1" + b"}" * 70)
    with pytest.raises(ValueError, match="nests 70 levels deep"):
        tc.load(path, {"a": jnp.ones(1)})


def test_a_header_nested_exactly_to_the_limit_is_not_refused_for_its_depth(tmp_path):
    path = tmp_path / "m.safetensors"
    write_raw_header(path, b'{"a":' * 64 + b"1" + b"}" * 64)
    with pytest.raises(ValueError, match="header entry of tensor 'a' is malformed") as info:
        tc.load(path, {"a": jnp.ones(1)})
    assert "levels" not in str(info.value)


def test_deeply_nested_treeclass_metadata_is_a_value_error(tmp_path):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"a": jnp.ones(1), "s": "x"})
    header, data = read_header(path)
    document = _document(header)
    value: Any = "x"
    for _ in range(400):
        value = {"tuple": [value]}
    document["values"]["s"]["value"] = value
    header["__metadata__"]["treeclass"] = json.dumps(document)
    write_header(path, header, data)
    with pytest.raises(ValueError, match="treeclass metadata is not valid JSON.*limit of 64"):
        tc.load(path, {"a": jnp.ones(1), "s": "x"})


def test_a_header_over_100_megabytes_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "m.safetensors"
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", 150_000_000))
        file.truncate(200_000_000)  # sparse: no disk is used
    with pytest.raises(ValueError, match="more than the limit of 100000000"):
        tc.load(path, {"a": jnp.ones(1)})


def test_a_claimed_header_one_byte_over_the_limit_is_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", 100_000_001))
        file.truncate(8 + 100_000_001)  # sparse: no disk is used
    with pytest.raises(ValueError, match=r"m\.safetensors.*100000001 bytes.*limit of 100000000"):
        tc.load(path, {"a": jnp.ones(1)})


def test_a_header_of_exactly_the_limit_is_written_and_read_and_one_byte_more_is_refused(
    tmp_path,
):
    from safetensors import safe_open

    path = tmp_path / "m.safetensors"

    def tree(size: int) -> dict:
        return {"w": jnp.ones(1), "s": tc.freeze("a" * size)}

    tc.save(path, tree(0))
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    # each "a" adds one byte to the header; the writer pads it to a multiple of 8 bytes
    size = 100_000_000 - len(raw[8 : 8 + length].rstrip(b" "))
    tc.save(path, tree(size))
    with open(path, "rb") as file:
        assert struct.unpack("<Q", file.read(8)) == (100_000_000,)
    with safe_open(str(path), framework="np") as reference:
        assert list(reference.keys()) == ["w"]
    assert len(tc.unfreeze(tc.load(path, tree(0))["s"])) == size
    with pytest.raises(ValueError, match=r"m\.safetensors.*header would be 100000008 bytes"):
        tc.save(path, tree(size + 1))
    assert os.listdir(tmp_path) == ["m.safetensors"]  # the file at the limit, untouched
    with open(path, "rb") as file:
        assert struct.unpack("<Q", file.read(8)) == (100_000_000,)


# ------------------------------------------------------------------------------------------
# every error names the file and the key path
# ------------------------------------------------------------------------------------------


def test_an_unknown_prng_implementation_names_the_file_and_tensor(tmp_path):
    path = tmp_path / "keys.safetensors"
    tc.save(path, {"key": jax.random.key(0)})
    header, data = read_header(path)
    document = _document(header)
    document["tensors"]["key"]["impl"] = "no_such_prng"
    header["__metadata__"]["treeclass"] = json.dumps(document)
    write_header(path, header, data)
    with pytest.raises(ValueError, match=r"keys\.safetensors.*'key'.*'no_such_prng'"):
        tc.load(path, {"key": jax.random.key(1)})


def test_prng_key_data_of_the_wrong_size_names_the_file(tmp_path):
    path = tmp_path / "keys.safetensors"
    tc.save(path, {"key": jax.random.key(0)})
    header, data = read_header(path)
    document = _document(header)
    document["tensors"]["key"]["impl"] = "rbg"  # rbg keys have 4 words, not 2
    header["__metadata__"]["treeclass"] = json.dumps(document)
    write_header(path, header, data)
    with pytest.raises(ValueError, match=r"keys\.safetensors.*'rbg'.*cannot make"):
        tc.load(path, {"key": jax.random.key(1)})


class _FailingReads:
    """A checkpoint file whose reads of tensor data fail, as a disk or network error would."""

    def __init__(self, file: Any) -> None:
        self.file = file

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)

    def __enter__(self) -> _FailingReads:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.file.close()

    def readinto(self, buffer: Any) -> int:
        raise OSError(errno.EIO, "Input/output error")


def test_an_io_error_inside_a_tensor_names_the_file_and_the_key_path(tmp_path, monkeypatch):
    from treeclass._checkpoint.files import _files

    path = tmp_path / "m.safetensors"
    tc.save(path, {"layers": [{"w": jnp.ones(3)}]})
    opened = _files.open_for_reading
    monkeypatch.setattr(_files, "open_for_reading", lambda p: _FailingReads(opened(p)))
    monkeypatch.delattr(os, "preadv", raising=False)  # read through the file object
    with pytest.raises(OSError) as info:
        tc.load(path, {"layers": [{"w": jnp.zeros(3)}]})
    message = str(info.value)
    assert info.value.errno == errno.EIO and info.value.filename == str(path)
    assert "'layers.0.w'" in message and "tree['layers'][0]['w']" in message, message
    assert "Input/output error" in message


@pytest.mark.skipif(not hasattr(os, "preadv"), reason="positioned reads are POSIX-only")
def test_an_io_error_of_a_positioned_read_names_the_file_and_the_key_path(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"layers": [{"w": jnp.ones(3)}]})

    def failing(descriptor: int, buffers: Any, offset: int) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", failing)
    with pytest.raises(OSError) as info:
        tc.load(path, {"layers": [{"w": jnp.zeros(3)}]})
    message = str(info.value)
    assert info.value.errno == errno.EIO and info.value.filename == str(path)
    assert "'layers.0.w'" in message and "tree['layers'][0]['w']" in message, message


def test_a_save_into_a_missing_folder_names_the_target(tmp_path):
    path = tmp_path / "no" / "model.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        tc.save(path, {"a": jnp.ones(1)})
    message = str(info.value)
    assert str(path) in message and "does not exist" in message and ".tmp" not in message


def test_a_save_onto_a_folder_names_it_and_leaves_no_temporary(tmp_path):
    os.mkdir(tmp_path / "model.safetensors")
    with pytest.raises(OSError, match=r"tc\.save cannot write .*model\.safetensors") as info:
        tc.save(tmp_path / "model.safetensors", {"a": jnp.ones(1)})
    assert ".tmp" not in str(info.value)
    assert os.listdir(tmp_path) == ["model.safetensors"]
    assert os.listdir(tmp_path / "model.safetensors") == []


def test_a_save_that_meets_a_deleted_array_names_the_leaf_and_file(tmp_path):
    broken = jnp.zeros(4)
    broken.delete()
    with pytest.raises(RuntimeError, match=r"m\.safetensors: reading tree\['b'\]\[0\].*deleted"):
        tc.save(tmp_path / "m.safetensors", {"a": jnp.ones(1), "b": [broken]})
    assert os.listdir(tmp_path) == []


def test_save_errors_about_the_tree_name_the_file(tmp_path):
    path = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match=r"m\.safetensors: an abstract value at tree\['w'\]"):
        tc.save(path, jax.eval_shape(lambda: {"w": jnp.ones(2)}))


# ------------------------------------------------------------------------------------------
# saving keeps the file's mode; every valid name is savable
# ------------------------------------------------------------------------------------------


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444, 0o755])
def test_resaving_keeps_the_permission_bits(tmp_path, mode):
    path = tmp_path / "m.safetensors"
    tc.save(path, {"a": jnp.ones(1)})
    os.chmod(path, mode)
    tc.save(path, {"a": jnp.zeros(1)})
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert tc.load(path, {"a": jnp.ones(1)})["a"].tolist() == [0.0]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o027])
def test_a_new_file_follows_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        tc.save(tmp_path / "m.safetensors", {"a": jnp.ones(1)})
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "m.safetensors").st_mode) == 0o666 & ~umask


@pytest.mark.parametrize("length", [200, 240, 250, 255])
def test_every_name_the_filesystem_accepts_is_savable(tmp_path, length):
    name = "m" * (length - len(".safetensors")) + ".safetensors"
    try:
        with open(tmp_path / name, "wb"):
            pass
    except OSError:
        pytest.skip("this filesystem's names are shorter")
    os.unlink(tmp_path / name)
    tc.save(tmp_path / name, {"a": jnp.ones(1)})
    tc.save(tmp_path / name, {"a": jnp.full(1, 2.0)})  # and replaced
    assert os.listdir(tmp_path) == [name]
    assert tc.load(tmp_path / name, {"a": jnp.ones(1)})["a"].tolist() == [2.0]


def test_a_multibyte_name_of_255_bytes_is_savable(tmp_path):
    name = "é" * 121 + ".safetensors"  # 242 + 12 = 254 bytes
    assert len(name.encode()) == 254
    tc.save(tmp_path / name, {"a": jnp.ones(1)})
    assert os.listdir(tmp_path) == [name]


# ------------------------------------------------------------------------------------------
# closest-name hints stay cheap
# ------------------------------------------------------------------------------------------


@LOSSY
def test_ten_thousand_renamed_keys_each_get_their_closest_name():
    count = 10_000
    like = {"layers": [{"weight": np.zeros(1, np.float32)} for _ in range(count)]}
    state = {"blocks": [{"weight": np.zeros(1, np.float32)} for _ in range(count)]}
    _, report = tc.from_state_dict(like, state, strict=False)
    assert len(report.missing) == len(report.unexpected) == count
    hints = [line for line in report.messages if line.startswith("missing")]
    assert hints[0].endswith("(closest: 'blocks.0.weight')")
    assert hints[-1].endswith(f"(closest: 'blocks.{count - 1}.weight')")
    assert all("closest: 'blocks." in line for line in hints)


def test_a_strict_load_of_ten_thousand_renamed_tensors_names_each_closest_name(tmp_path):
    from safetensors.numpy import save_file

    count = 10_000
    path = str(tmp_path / "renamed.safetensors")
    save_file({f"blocks.{i}.weight": np.zeros(1, np.float32) for i in range(count)}, path)
    like = {"layers": [{"weight": np.zeros(1, np.float32)} for _ in range(count)]}
    with pytest.raises(ValueError) as info:
        tc.load(path, like)
    lines = str(info.value).splitlines()
    assert f"{2 * count} problems" in lines[0]
    hint = "no 'layers.7.weight' in the file (closest: 'blocks.7.weight')"
    assert f"  missing     tree['layers'][7]['weight']: {hint}" in lines
    assert sum("(closest: 'blocks." in line for line in lines) == count


@pytest.mark.parametrize(
    "missing, unused, closest",
    [
        ("layers.1.weight", ["layers.1.wieght", "extra"], "layers.1.wieght"),
        ("heads", ["head", "old"], "head"),
        ("encoder.w", ["model.encoder.w", "decoder.b"], "model.encoder.w"),
        ("blocks.3.attn.q", ["blocks.3.attention.q", "blocks.4.mlp"], "blocks.3.attention.q"),
        ("weight", ["zzz", "qqq"], None),
    ],
)
@LOSSY
def test_the_closest_name_hint_finds_renames(missing, unused, closest):
    like = {missing: np.zeros(1)}
    _, report = tc.from_state_dict(like, {n: np.zeros(1) for n in unused}, strict=False)
    line = report.messages[0]
    if closest is None:
        assert "closest" not in line
    else:
        assert line.endswith(f"(closest: {closest!r})")


# ------------------------------------------------------------------------------------------
# fuzzing: random bytes and mutated files
# ------------------------------------------------------------------------------------------

_TEMPLATE = {
    "a": jnp.arange(6.0).reshape(2, 3),
    "b": np.array([True, False]),
    "k": jax.random.key(1),
    "c": np.ones(2, np.complex128),
    "s": "text",
    "n": 3,
    "f": tc.freeze(abs),
}


def _load_or_refuse(path: Any) -> None:
    for strict in (True, False):
        try:
            tc.load(path, _TEMPLATE, strict=strict)
        except (ValueError, OSError):
            pass


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=300))
def test_random_bytes_load_or_raise_value_errors(tmp_path, data):
    path = tmp_path / "random.safetensors"
    path.write_bytes(data)
    _load_or_refuse(path)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=200), st.integers(0, 2**64 - 1))
def test_random_headers_load_or_raise_value_errors(tmp_path, data, length):
    path = tmp_path / "random.safetensors"
    path.write_bytes(struct.pack("<Q", length) + data)
    _load_or_refuse(path)


def _mutate(raw: bytes, rng: random.Random) -> bytes:
    data = bytearray(raw)
    (length,) = struct.unpack("<Q", raw[:8])
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        at = rng.randrange(len(data)) if data else 0
        header_at = 8 + rng.randrange(max(length, 1))
        if kind == 0 and data:  # flip a bit anywhere
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1 and header_at < len(data):  # a JSON-ish byte in the header
            data[header_at] = rng.choice(b'{}[]",:0123456789-.eE \\"utn')
        elif kind == 2:  # truncate
            data = data[:at]
        elif kind == 3:  # insert bytes
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 4 and len(data) >= 8:  # another header length
            data[:8] = struct.pack("<Q", max(0, length + rng.randint(-16, 16)))
        elif kind == 5 and header_at < len(data):  # delete a header byte
            del data[header_at]
    return bytes(data)


def test_mutated_valid_files_load_or_raise_value_errors(tmp_path):
    valid = tmp_path / "valid.safetensors"
    tc.save(valid, _TEMPLATE)
    raw = valid.read_bytes()
    rng = random.Random(20261202)
    path = tmp_path / "mutated.safetensors"
    loaded = 0
    for _ in range(800):  # a bounded number of mutations: a few seconds
        path.write_bytes(_mutate(raw, rng))
        try:
            tc.load(path, _TEMPLATE, strict=False)
            loaded += 1
        except (ValueError, OSError):
            pass
    assert loaded < 800  # the mutations did reach the checks


_DOCUMENT_TEMPLATE = {
    **_TEMPLATE,
    "i4": np.array([1, -2], ml_dtypes.int4),
    "values": (float("nan"), 1j, -float("inf"), None, (1, "y")),
    "weak": jnp.asarray(0.5),
    "tagged": Tagged(jnp.ones(1), tag=(abs, "g", 2.5)),
}


def _mutate_text(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        kind, at = rng.randrange(4), rng.randrange(len(chars))
        if kind == 0:
            chars[at] = rng.choice('{}[]",:0123456789-.eE \\utnfals')
        elif kind == 1:
            del chars[at]
        elif kind == 2:
            token = rng.choice(['"x"', "[]", "{}", "1", "null", '{"float":"inf"}', '{"tuple":[]}'])
            chars[at:at] = token
        else:  # one JSON value for another of the same shape
            joined = "".join(chars)
            old, new = rng.choice(
                [("true", "false"), ('"leaf"', '"static"'), ("uint8", "uint32"), ("2,3", "3,2")]
            )
            chars = list(joined.replace(old, new, 1))
    return "".join(chars)


@LOSSY
def test_mutated_treeclass_metadata_loads_or_raises_value_errors(tmp_path):
    # the header stays valid JSON, so the mutations reach the checks of our own metadata
    path = tmp_path / "m.safetensors"
    tc.save(path, _DOCUMENT_TEMPLATE)
    header, data = read_header(path)
    text = header["__metadata__"]["treeclass"]
    rng = random.Random(20261203)
    refused = 0
    for _ in range(300):  # a bounded number of mutations: a few seconds
        header["__metadata__"]["treeclass"] = _mutate_text(text, rng)
        write_header(path, header, data)
        try:
            tc.load(path, _DOCUMENT_TEMPLATE, strict=False)
        except (ValueError, OSError):
            refused += 1
    assert 0 < refused < 300


# --------------------------------------------------------------------------------------
# Claims in headers: no read asks for more than the file holds
# --------------------------------------------------------------------------------------


def _refusal_and_peak(path: Any, like: Any) -> tuple[ValueError, int]:
    """The ValueError of `tc.load(path, like)` and the most memory Python and NumPy held
    while it ran (what a read sized by a header's claim would allocate shows here)."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as info:
            tc.load(path, like)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value, peak


_SLACK = 1 << 20  # what a load allocates whatever the file: parsers, messages, tracebacks


def _npy_header_claim(version: int, claim: int, tail: bytes) -> bytes:
    form = "<H" if version == 1 else "<I"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack(form, claim) + tail


_CLAIM_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
_CLAIMS = st.one_of(
    st.sampled_from([2**31, 2**32 - 1, 2**16 - 1, 10_001]),
    st.integers(0, 2**32 - 1),
)


@_CLAIM_SETTINGS
@given(version=st.sampled_from([1, 2]), claim=_CLAIMS, tail=st.binary(max_size=40))
def test_law_an_equinox_header_length_claim_allocates_nothing_beyond_the_file(
    tmp_path, version, claim, tail
):
    if version == 1:
        claim %= 2**16
    path = tmp_path / "leaves.eqx"
    path.write_bytes(_npy_header_claim(version, claim, tail))
    error, peak = _refusal_and_peak(path, {"w": np.zeros(2, np.float32)})
    assert str(path) in str(error)
    assert peak < path.stat().st_size + _SLACK, peak


def _stored_npz(tmp_path: Any) -> tuple[Any, bytearray, Any]:
    import zipfile

    path = tmp_path / "arrays.npz"
    np.savez(path, w=np.arange(4, dtype=np.float32))
    with zipfile.ZipFile(path) as archive:
        (info,) = archive.infolist()
    return path, bytearray(path.read_bytes()), info


@_CLAIM_SETTINGS
@given(claim=_CLAIMS, part=st.sampled_from(["npy header", "central directory"]))
def test_law_an_npz_size_claim_allocates_nothing_beyond_the_file(tmp_path, claim, part):
    path, raw, info = _stored_npz(tmp_path)
    if part == "npy header":  # the record's header length, as np.savez stores it (v1.0)
        name, extra = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
        at = info.header_offset + 30 + name + extra + 8
        raw[at : at + 2] = struct.pack("<H", claim % 2**16)
    else:  # the end record's size of the central directory
        end = raw.rfind(b"PK\x05\x06")
        raw[end + 12 : end + 16] = struct.pack("<I", claim)
    path.write_bytes(bytes(raw))
    try:
        error, peak = _refusal_and_peak(path, {"w": np.zeros(4, np.float32)})
    except pytest.fail.Exception:  # the claim happened to be the true one: it loads
        return
    assert str(path) in str(error)
    assert peak < path.stat().st_size + _SLACK, peak


@_CLAIM_SETTINGS
@given(
    claim=_CLAIMS,
    kind=st.sampled_from([b"\xdd", b"\xdf", b"\xc6", b"\xdb"]),  # array, map, bin, str
    tail=st.binary(max_size=40),
)
def test_law_a_flax_length_claim_allocates_nothing_beyond_the_file(tmp_path, claim, kind, tail):
    path = tmp_path / "state.msgpack"
    # a map whose first key is a value claiming `claim` items or bytes
    path.write_bytes(b"\x81" + kind + struct.pack(">I", claim) + tail)
    error, peak = _refusal_and_peak(path, {"w": np.zeros(2, np.float32)})
    assert str(path) in str(error)
    assert peak < path.stat().st_size + _SLACK, peak


def test_a_sharded_index_is_read_with_a_read_sized_by_the_file(tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    error, peak = _refusal_and_peak(index, {"w": np.zeros(2, np.float32)})
    assert "does not exist" in str(error) and str(index) in str(error)
    assert peak < index.stat().st_size + _SLACK, peak


def test_an_11_byte_equinox_file_claiming_4_gib_is_refused_under_a_3_gib_limit(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "leaves.eqx"
    path.write_bytes(_npy_header_claim(2, 2**32 - 1, b"{"))
    assert path.stat().st_size == 13
    script = (
        "import resource, sys, numpy as np, treeclass as tc\n"
        "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (used + 3 * 2**30, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    tc.load(sys.argv[1], {'w': np.zeros(2, np.float32)})\n"
        "except ValueError as error:\n"
        "    print('ValueError', error)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # the checkout first, then what the machine put on PYTHONPATH (its jax, perhaps)
    inherited = os.environ.get("PYTHONPATH", "")
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(filter(None, [root, inherited])),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ValueError") and str(path) in proc.stdout


# ------------------------------------------------------------------------------------------
# the bytes each process reads and writes: coalesced reads, balanced shares, the counters
# ------------------------------------------------------------------------------------------


class _Ranges:
    """A tensor's bytes behind `read_range`, counting each read."""

    def __init__(self, data: np.ndarray) -> None:
        self.data, self.reads = data.reshape(-1).view(np.uint8), []

    def __call__(self, start: int, stop: int) -> np.ndarray:
        assert 0 <= start <= stop <= len(self.data), (start, stop)
        self.reads.append((start, stop))
        return self.data[start:stop].copy()


def _read(values: np.ndarray, bounds: tuple) -> tuple[np.ndarray, _Ranges]:
    from treeclass._checkpoint.files._processes import read_block

    ranges = _Ranges(values)
    block = read_block(bounds, values.shape, values.itemsize, ranges)
    return block.view(values.dtype).reshape(block.shape[:-1]), ranges


def test_a_band_of_half_the_columns_is_one_read_not_one_per_row():
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    block, ranges = _read(values, ((0, 64), (16, 32)))
    np.testing.assert_array_equal(block, values[:, 16:])
    assert ranges.reads == [(16 * 4, 64 * 32 * 4)]  # gaps included: under twice the block


def test_a_narrow_band_of_columns_is_not_read_through_its_wide_gaps():
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    block, ranges = _read(values, ((0, 64), (8, 12)))  # 16 bytes a row, 112 between
    np.testing.assert_array_equal(block, values[:, 8:12])
    assert len(ranges.reads) == 64 and sum(b - a for a, b in ranges.reads) == block.nbytes


def test_gaps_over_the_gap_limit_are_never_read_through(monkeypatch):
    from treeclass._checkpoint.files import _processes

    monkeypatch.setattr(_processes, "GAP_LIMIT", 63)
    values = np.arange(8 * 32, dtype=np.float32).reshape(8, 32)
    block, ranges = _read(values, ((0, 8), (0, 16)))  # 64-byte runs, 64-byte gaps
    np.testing.assert_array_equal(block, values[:, :16])
    assert len(ranges.reads) == 8


def test_one_coalesced_read_is_at_most_group_bytes_long(monkeypatch):
    from treeclass._checkpoint.files import _processes

    monkeypatch.setattr(_processes, "GROUP_BYTES", 1000)
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    block, ranges = _read(values, ((0, 64), (0, 24)))
    np.testing.assert_array_equal(block, values[:, :24])
    assert all(b - a <= 1000 for a, b in ranges.reads) and 1 < len(ranges.reads) < 64


@settings(max_examples=150, deadline=None)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    data=st.data(),
    dtype=st.sampled_from(["uint8", "float16", "float32", "float64"]),
)
def test_law_a_block_reads_its_values_with_at_most_twice_its_bytes(shape, data, dtype):
    from treeclass._checkpoint.files._processes import OVER_READ

    values = np.arange(np.prod(shape)).astype(dtype).reshape(shape)
    bounds = []
    for n in shape:
        start = data.draw(st.integers(0, n - 1))
        bounds.append((start, data.draw(st.integers(start + 1, n))))
    block, ranges = _read(values, tuple(bounds))
    np.testing.assert_array_equal(block, values[tuple(slice(a, b) for a, b in bounds)])
    total = sum(b - a for a, b in ranges.reads)
    assert total <= OVER_READ * block.nbytes
    assert ranges.reads == sorted(ranges.reads)  # in file order, none overlapping
    assert all(b <= c for (_, b), (c, _) in zip(ranges.reads, ranges.reads[1:]))


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(1, 5),
    pieces=st.lists(
        st.tuples(st.integers(0, 10_000), st.sets(st.integers(0, 4), min_size=1)), max_size=30
    ),
)
def test_law_balance_writes_every_byte_once_by_a_holder_and_evens_the_shares(count, pieces):
    from treeclass._checkpoint.files._processes import balance

    pieces = [(n, sorted(p % count for p in holders)) for n, holders in pieces]
    pieces = [(n, sorted(set(holders))) for n, holders in pieces]
    parts = balance(pieces, count)
    assert parts == balance(pieces, count)  # every process computes the same split
    load = [0] * count
    for (nbytes, holders), ranges in zip(pieces, parts, strict=True):
        covered = 0
        for process, start, stop in ranges:
            assert process in holders and start == covered and stop > start
            covered = stop
            load[process] += stop - start
        assert covered == nbytes
    # with every shared piece held by all, nobody writes more than its fair share or
    # than what only it holds
    if all(len(h) in (1, count) for _, h in pieces):
        fixed = [sum(n for n, h in pieces if h == [p]) for p in range(count)]
        fair = -(-sum(n for n, _ in pieces) // count)
        assert max(load) <= max(max(fixed), fair)


def test_a_sharded_save_counts_the_bytes_it_writes_and_a_load_those_it_reads(tmp_path):
    from treeclass._checkpoint.files._files import IO

    tree = {"big": jnp.arange(5000.0), "small": [jnp.ones(3)] * 4, "host": np.ones((7, 2))}
    path = tmp_path / "model.safetensors.index.json"
    IO.reset()
    tc.save(path, tree, max_shard_size="8kB")
    files = list(tmp_path.iterdir())
    assert IO.written_bytes == sum(p.stat().st_size for p in files) and len(files) == 3
    IO.reset()
    tc.load(path, tree)
    assert IO.read_bytes == 4 * (5000 + 12) + 8 * 14  # each tensor's bytes, once
    assert IO.reads == 6


def test_a_failed_sharded_save_leaves_the_previous_one_and_no_temporary(tmp_path):
    path = tmp_path / "model.safetensors.index.json"
    tc.save(path, {"a": jnp.ones(300), "b": [jnp.zeros(4)]}, max_shard_size="1kB")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    broken = jnp.zeros(4)
    broken.delete()
    with pytest.raises(RuntimeError, match=r"reading tree\['b'\]\[0\].*deleted"):
        tc.save(path, {"a": jnp.ones(300) * 2, "b": [broken]}, max_shard_size="1kB")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
