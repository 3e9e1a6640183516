"""The public checkpoint functions: `save`, `load`, `state_dict`, `from_state_dict`."""

from __future__ import annotations

import functools
import os
from typing import Any, Literal, TypeVar, overload

from ._document import METADATA_KEY, PlannedTensor, SourceCatalog, plan
from ._files import open_for_reading, write_atomically
from ._safetensors import OutTensor, SafetensorsFile, can_store, header_bytes, write_tensors
from ._tree import LoadReport, StateCatalog, entries, host_bytes, restore, state_dict_of

__all__ = ["state_dict", "from_state_dict", "save", "load", "LoadReport"]

PyTree = Any
_T = TypeVar("_T")


def state_dict(tree: PyTree) -> dict:
    """The data of `tree` as a plain nested dict: the shape orbax and flax-style tools expect.

    Keys are field names, dict keys and sequence indices (as ints). Values are every array
    leaf, every frozen array (unfrozen, as an array; also inside frozen subtrees), numpy
    scalars and Python numbers that are leaves or frozen. Strings, functions, other
    objects and static fields are not data: `from_state_dict` takes them from its
    template. Arrays are not copied. On an abstract tree (from `jax.eval_shape`) the
    values are `jax.ShapeDtypeStruct`s: a restore target for orbax.

    **Arguments**

    - `tree`: any pytree, possibly holding `TreeClass` instances and frozen values.

    **Returns**

    A nested `dict`; nodes without data (a layer of strings only) do not appear.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    class Linear(tc.TreeClass):
        weight: jnp.ndarray
        table: object
        act: object = tc.freeze("tanh")
        name: str = tc.field(default="linear", static=True)

    model = {"layers": [Linear(jnp.ones((2, 2)), tc.freeze(jnp.arange(3)))], "step": 7}
    state = tc.state_dict(model)
    assert list(state["layers"][0]) == ["weight", "table"]
    assert state["step"] == 7 and state["layers"][0]["table"].shape == (3,)
    ```
    """
    return state_dict_of(tree)


@overload
def from_state_dict(like: _T, state: dict, *, strict: Literal[True] = True) -> _T: ...
@overload
def from_state_dict(like: _T, state: dict, *, strict: Literal[False]) -> tuple[_T, LoadReport]: ...
@overload
def from_state_dict(like: _T, state: dict, *, strict: bool) -> _T | tuple[_T, LoadReport]: ...
def from_state_dict(like: PyTree, state: dict, *, strict: bool = True) -> Any:
    """The inverse of `state_dict`: `like` with its data taken from `state`.

    The template `like` gives the structure, what is frozen (restored values are frozen
    again), static fields and every value that is not data (strings, functions).
    Arrays take the template's type: a numpy array for a numpy leaf, a `jax.Array` placed
    with the template's sharding for a `jax.Array` or a `jax.ShapeDtypeStruct` with a
    `sharding` (arrays in `state` already placed that way are used as they are). Keys
    that are ints in `like` may be strings in `state` (orbax restores them so).

    **Arguments**

    - `like`: a tree of the right structure: a model, or an abstract one from
      `jax.eval_shape`.
    - `state`: a nested dict as made by `state_dict` (or restored by orbax).
    - `strict`: if True, any missing key, unexpected key, or shape, dtype or type
      mismatch raises. If False, restore what fits.

    **Returns**

    The restored tree; with `strict=False`, a pair `(tree, report)` where `report` is a
    `LoadReport` (see `load`).

    **Raises**

    `ValueError` naming every key path that does not fit (with `strict=True`).

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    model = {"w": jnp.ones(2), "table": tc.freeze(jnp.arange(3)), "act": tc.freeze("tanh")}
    state = tc.state_dict(model)
    state["w"] = state["w"] * 2
    restored = tc.from_state_dict(model, state)
    assert restored["w"].tolist() == [2.0, 2.0] and tc.is_frozen(restored["table"])

    restored, report = tc.from_state_dict(model, {"w": jnp.zeros(2)}, strict=False)
    assert report.missing == ("tree['table']",)
    ```
    """
    if not isinstance(state, dict):
        raise TypeError(
            f"tc.from_state_dict expects a dict as made by tc.state_dict, got a "
            f"{type(state).__name__}"
        )
    return restore(like, StateCatalog(state), strict, "tc.from_state_dict")


def save(path: str | os.PathLike, tree: PyTree) -> None:
    """Save `tree` to one safetensors file at `path`, without pickle.

    Every array (frozen ones too) and numpy scalar is a tensor named by its key path
    joined with dots (`layers.0.weight`); any dtype round-trips bit-exactly. Python
    numbers, strings, `None` and tuples or lists of them (leaves, frozen values and
    static fields) go into the header's metadata as JSON, so `load` can restore them and
    check the template's static values. Functions and other objects are not saved: `load`
    takes them from its template.

    The file is written to a temporary file in the same folder and then renamed over
    `path`: if saving fails or the process dies, `path` still holds the previous
    checkpoint. Arrays are copied to the host one at a time, so the extra host memory
    stays near the size of the largest leaf.

    **Arguments**

    - `path`: the file to write (by convention `*.safetensors`); its folder must exist.
    - `tree`: any pytree of arrays, numbers and TreeClass instances. Sharded arrays are
      gathered to this host; use orbax for arrays spread over several hosts.

    **Returns**

    None.

    **Raises**

    `ValueError` for an abstract value (a `jax.ShapeDtypeStruct`), an array this process
    cannot read whole, or two key paths with the same name; the file is untouched.

    ```python
    import os, tempfile
    import jax.numpy as jnp
    import treeclass as tc

    model = {"w": jnp.ones((2, 3), jnp.bfloat16), "step": 10, "act": tc.freeze("relu")}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        tc.save(path, model)
        restored = tc.load(path, model)
    assert tc.is_tree_equal(restored, model)
    ```
    """
    path = os.fspath(path)
    try:
        found = entries(tree, "tc.save", "tc.save(path, value)", to_file=True)
        document, planned = plan(tree, found, can_store)
        tensors = [
            OutTensor(t.name, t.dtype, t.shape, t.nbytes, functools.partial(_leaf_bytes, t, path))
            for t in planned
        ]
        header = header_bytes({METADATA_KEY: document}, tensors)
    except ValueError as error:  # before anything is written
        raise ValueError(f"tc.save cannot write {path}: {error}") from None
    try:
        write_atomically(path, lambda file: write_tensors(file, header, tensors))
    except OSError as error:
        if error.errno is None:
            raise
        reason = str(error.strerror)
        if not reason.startswith("cannot write"):
            reason = f"cannot write {path}: {reason}"
        raise type(error)(error.errno, f"tc.save {reason}", path) from error


def _leaf_bytes(tensor: PlannedTensor, path: str) -> Any:
    try:
        return host_bytes(tensor.value)
    except Exception as error:  # a deleted (donated) array, a failed device transfer
        message = f"tc.save cannot write {path}: reading {tensor.where} failed: {error}"
        try:
            renamed = type(error)(message)
        except Exception:  # an exception type that takes other arguments
            renamed = RuntimeError(message)
        raise renamed from error


@overload
def load(path: str | os.PathLike, like: _T, *, strict: Literal[True] = True) -> _T: ...
@overload
def load(path: str | os.PathLike, like: _T, *, strict: Literal[False]) -> tuple[_T, LoadReport]: ...
@overload
def load(path: str | os.PathLike, like: _T, *, strict: bool) -> _T | tuple[_T, LoadReport]: ...
def load(path: str | os.PathLike, like: PyTree, *, strict: bool = True) -> Any:
    """Load the checkpoint at `path` into the template `like`.

    The template gives the structure, what is frozen (restored values are frozen again),
    and every value the file does not hold (functions, objects); the file gives the data,
    strings and frozen values, and is checked against the template's static values.
    Arrays take the template's type: numpy for a numpy leaf, else a `jax.Array` placed
    like the template's leaf: with the `sharding` of a `jax.ShapeDtypeStruct`, the
    sharding of a committed or sharded `jax.Array`, or on the default device. With an
    abstract template (`jax.eval_shape(lambda: Model(...))`) nothing is allocated twice:
    each tensor is read into one host buffer and placed from there.

    A file written by another tool (plain safetensors, no treeclass metadata) loads too
    when its tensor names are the template's key paths joined with dots; values other
    than numbers then come from the template.

    **Arguments**

    - `path`: a file written by `save`, or any safetensors file.
    - `like`: a tree of the right structure: a model, or an abstract one.
    - `strict`: if True (the default), any missing or unexpected key, shape, dtype or
      type mismatch, or differing static value raises one `ValueError` naming every key
      path. If False, restore what fits and report the rest.

    **Returns**

    The restored tree. With `strict=False`, a pair `(tree, report)`; `report` is a
    `NamedTuple` with `missing` and `mismatched` (the template's key paths, like
    `MLP.layers[0].weight`, left at the template's values; `kept` is both), `unexpected`
    (names in the file, like `layers.2.weight`, that were ignored) and `messages` (one
    line per problem). A path left at the value of an abstract template stays a
    `jax.ShapeDtypeStruct`.

    **Raises**

    `ValueError` for a corrupted or truncated file, whatever `strict` is; nothing is
    returned in part.

    ```python
    import os, tempfile
    import jax, jax.numpy as jnp
    import treeclass as tc

    class Linear(tc.TreeClass):
        weight: jax.Array
        bias: jax.Array

    model = Linear(jnp.ones((3, 2)), jnp.zeros(2))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "linear.safetensors")
        tc.save(path, model)
        abstract = jax.eval_shape(lambda: Linear(jnp.zeros((3, 2)), jnp.zeros(2)))
        restored = tc.load(path, abstract)
        bigger = jax.eval_shape(lambda: Linear(jnp.zeros((3, 4)), jnp.zeros(4)))
        partial, report = tc.load(path, bigger, strict=False)
    assert tc.is_tree_equal(restored, model)
    assert report.mismatched == ("Linear.weight", "Linear.bias")
    ```
    """
    path = os.fspath(path)
    with open_for_reading(path) as file:
        source = SafetensorsFile(file, path)
        return restore(like, SourceCatalog(source), strict, "tc.load")
