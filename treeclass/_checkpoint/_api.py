"""The public checkpoint functions: `save`, `load`, `state_dict`, `from_state_dict`."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict, TypeVar, overload

import jax
import numpy as np
from typing_extensions import Unpack

from .._at import AtIndexer
from .._structure import is_wrapper
from .._values import path_str
from .files._files import reworded
from .files._processes import DEFAULT_TIMEOUT_S, save_from_processes
from .files._source import CheckpointWriter, OutTensor
from .formats._formats import open_source, writer_for
from .names._catalog import Catalog
from .names._check import LoadReport
from .names._document import METADATA_KEY, PlannedTensor, SourceCatalog, plan, tensor_bytes
from .names._export import ForeignTensor, export
from .names._fixes import listed
from .names._restore import restore
from .names._rules import Rule, RuledCatalog, compile_rules
from .names._stacks import stacks_of
from .names._state import StateCatalog, state_dict_of
from .names._versions import migrate
from .names._walk import STATIC

PyTree = Any
_T = TypeVar("_T")
Missing = Literal["error", "keep", "warn"]
Unexpected = Literal["error", "ignore"]
Format = Literal["safetensors", "sharded", "npz", "flax", "equinox"]


class _Options(TypedDict, total=False):
    """The keywords of `from_state_dict` besides `strict` and `dry_run`."""

    rules: object
    where: object
    missing: Missing | None
    unexpected: Unexpected | None


class _LoadOptions(_Options, total=False):
    format: Format | None


_PART_OF_A_LEAF = (
    "where= selects part of the leaf at {where} (some elements, or some blocks of a "
    "stack), but a load restores whole leaves. Select the whole leaf:\n"
    "    before: tc.load(path, model, where=model.at['w'][mask])\n"
    "    after:  tc.load(path, model, where=model.at['w'])"
)


def _selected(like: object, where: object) -> Callable[[tuple, str], bool] | None:
    """Which entries a partial load restores: those under the selection `where`."""
    if where is None:
        return None
    if isinstance(where, AtIndexer):
        if where.tree is not like:
            raise ValueError(
                "where= takes a selection of the template itself: "
                "`tc.load(path, model, where=model.at['encoder'])`"
            )
        chain = where.where
    else:  # a selector: a bool mask tree, a glob, a class, ...
        chain = (where,)
    # the selection's own answer, on the template itself (a predicate sees its values)
    flags = AtIndexer(like, chain).mask(is_leaf=is_wrapper)
    chosen = set()
    for path, flag in jax.tree_util.tree_flatten_with_path(flags, is_leaf=is_wrapper)[0]:
        if flag is True or (flag is not False and np.all(flag)):
            chosen.add(path)
        elif flag is not False and np.any(flag):
            raise ValueError(_PART_OF_A_LEAF.format(where=path_str(like, path)))
    within = {path[:k] for path in chosen for k in range(len(path) + 1)}

    def selected(node: tuple, kind: str) -> bool:
        # an entry is selected with its node (a static value with the TreeClass holding it,
        # which is selected when any of its leaves is)
        return (kind == STATIC and node in within) or any(
            node[:k] in chosen for k in range(len(node) + 1)
        )

    return selected


def _compiled(rules: object, action: str) -> tuple[Rule, ...]:
    try:
        return compile_rules(rules)
    except (TypeError, ValueError) as error:  # the rule is named: say who ran it too
        raise type(error)(f"{action}: {error}") from None


def _restore(
    like: object, catalog: Catalog, action: str, rules: object, where: object, **options: Any
) -> Any:
    """`restore` for an entry point: `catalog` through its key rules, `where` selected."""
    if rules is not None:
        # names the rules give for single layers of the template's stacks fill their slots
        catalog = RuledCatalog(catalog, _compiled(rules, catalog.title), stacks_of(like))
    return restore(like, catalog, action=action, selected=_selected(like, where), **options)


def state_dict(tree: PyTree, *, rules: object = None) -> dict:
    """The data of `tree` as a plain nested dict: the shape orbax and flax-style tools expect.

    Keys are field names, dict keys and sequence indices (as ints); values are every array
    (frozen ones unfrozen), numpy scalar and Python number, not copied (on an abstract tree,
    `jax.ShapeDtypeStruct`s: a restore target for orbax). Strings, functions, other objects
    and static fields are not data: `from_state_dict` takes them from its template.

    **Arguments**

    - `tree`: any pytree, possibly holding `TreeClass` instances and frozen values.
    - `rules`: key rules (as `load` takes them), run backwards as `save` runs them, to
      return another library's flat layout instead (the checkpoints guide, "Export").

    **Returns**

    A nested `dict`; nodes without data (a layer of strings only) do not appear. With
    `rules`, a flat `dict` of NumPy arrays, in natural order of the names.

    **Raises**

    With `rules`, `ValueError` as for `save`'s `rules`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    layer = {"w": jnp.ones(2), "table": tc.freeze(jnp.arange(3)), "act": tc.freeze("tanh")}
    state = tc.state_dict({"layers": [layer], "step": 7})
    assert list(state["layers"][0]) == ["table", "w"] and state["step"] == 7
    ```
    """
    if rules is None:
        return state_dict_of(tree)
    tensors = export(tree, _compiled(rules, "tc.state_dict"), "tc.state_dict")
    return {t.name: t.compute() for t in tensors}


@overload
def from_state_dict(
    like: _T,
    state: dict,
    *,
    strict: Literal[True] = True,
    dry_run: Literal[False] = False,
    **options: Unpack[_Options],
) -> _T: ...
@overload
def from_state_dict(
    like: _T,
    state: dict,
    *,
    strict: Literal[False],
    dry_run: Literal[False] = False,
    **options: Unpack[_Options],
) -> tuple[_T, LoadReport]: ...
@overload
def from_state_dict(
    like: PyTree,
    state: dict,
    *,
    strict: bool = True,
    dry_run: Literal[True],
    **options: Unpack[_Options],
) -> LoadReport: ...
@overload
def from_state_dict(
    like: PyTree,
    state: dict,
    *,
    strict: bool,
    dry_run: bool = False,
    **options: Unpack[_Options],
) -> Any: ...
def from_state_dict(
    like: PyTree,
    state: dict,
    *,
    strict: bool = True,
    rules: object = None,
    where: object = None,
    missing: Missing | None = None,
    unexpected: Unexpected | None = None,
    dry_run: bool = False,
) -> Any:
    """The inverse of `state_dict`: `like` with its data taken from `state`.

    The template gives the structure, what is frozen, static fields and every value that
    is not data; arrays take the template's type and sharding, as for `load`. Keys that
    are ints in `like` may be strings in `state` (orbax restores them so).

    **Arguments**

    - `like`: a tree of the right structure: a model, or an abstract one from
      `jax.eval_shape`.
    - `state`: a nested dict as made by `state_dict` (or restored by orbax).
    - `strict`: if True, any missing or unexpected key, or mismatch, raises; if False,
      restore what fits.
    - `rules`, `where`, `missing`, `unexpected`, `dry_run`: as for `load` (key rules
      apply to the state dict's dot-joined names, `layers.0.weight`).

    **Returns**

    The restored tree; with `strict=False`, a pair `(tree, report)` (see `load`).

    **Raises**

    `ValueError` naming every key path that does not fit.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    model = {"w": jnp.ones(2), "table": tc.freeze(jnp.arange(3)), "act": tc.freeze("tanh")}
    state = tc.state_dict(model)
    state["w"] = state["w"] * 2
    restored = tc.from_state_dict(model, state)
    assert restored["w"].tolist() == [2.0, 2.0] and tc.is_frozen(restored["table"])
    ```
    """
    if not isinstance(state, dict):
        raise TypeError(
            f"tc.from_state_dict expects a dict as made by tc.state_dict, got a "
            f"{type(state).__name__}"
        )
    options = dict(strict=strict, missing=missing, unexpected=unexpected, dry_run=dry_run)
    return _restore(like, StateCatalog(state), "tc.from_state_dict", rules, where, **options)


def save(
    path: str | os.PathLike,
    tree: PyTree,
    *,
    max_shard_size: int | str | None = None,
    rules: object = None,
    metadata: Mapping[str, str] | None = None,
    format: Literal["safetensors", "sharded"] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Save `tree` to one safetensors file at `path`, without pickle.

    Every array (frozen ones too) and numpy scalar is a tensor named by its key path
    joined with dots (`layers.0.weight`), bit-exact in any dtype; numbers, strings, `None`
    and tuples or lists of them go into the header's metadata as JSON; functions and
    other objects come from `load`'s template. The write is atomic, one array on the host
    at a time.

    **Arguments**

    - `path`: the file to write (by convention `*.safetensors`); its folder must exist.
    - `tree`: any pytree of arrays, numbers and TreeClass instances (sharded arrays are
      written whole).
    - `max_shard_size`: write sharded safetensors: `path` names the index
      (`model.safetensors.index.json`), the tensors going in the tree's order into shards
      of at most this many bytes (an int, or `"5GB"`, `"500MiB"`); shards of an earlier
      save the index no longer names are removed (the reference guide, "Sharded
      safetensors").
    - `rules`: write another library's layout: the key rules that load it, run backwards
      (a fourth element, `(source, target, transform, inverse)`, gives a transform's
      inverse); only tensors, in natural order of their names (the checkpoints guide,
      "Export" and "The plan").
    - `metadata`: strings for the header's `__metadata__` (sharded: the index's and every
      shard's), such as `{"format": "pt"}`.
    - `format`: `"safetensors"` or `"sharded"`, by default told by `max_shard_size`; a
      format `load` only reads (`"npz"`, `"flax"`, `"equinox"`) is an error.
    - `timeout`: with several processes, the most seconds one waits for another (300 by
      default). A tree of arrays spread over processes is saved by every process calling
      `save` with the same tree and path, any other by its caller alone (the multihost
      recipe, "Checkpoints with `tc.save`").

    **Raises**

    `ValueError` for an abstract value, two key paths of one name, or processes calling
    with different paths or trees; with `rules`, a rule the plan cannot run backwards,
    tied weights that differ, or an array spread over processes. `TimeoutError` for a
    process that does not call or stops. The file is untouched on any error.

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
        extra = _metadata(metadata)
        writer = writer_for(path, max_shard_size, format)
        if rules is not None:
            tensors, header_metadata = _export_plan(tree, rules, writer), extra
            # what the writers learn of each tensor besides its bytes (no value to gather)
            planned = [
                PlannedTensor(t.name, None, t.dtype, t.shape, t.nbytes, {}, t.name) for t in tensors
            ]
        else:
            document, planned = plan(tree, writer.can_store)
            tensors = [
                OutTensor(
                    t.name, t.dtype, t.shape, t.nbytes, functools.partial(_leaf_bytes, t, path)
                )
                for t in planned
            ]
            header_metadata = {**extra, METADATA_KEY: document}
        write = writer.prepare(header_metadata, tensors)
    except ValueError as error:  # before anything is written
        raise ValueError(f"tc.save cannot write {path}: {error}") from None
    try:
        # in a run of several processes: process 0 writes, the others gather with it
        save_from_processes(path, planned, write, timeout)
    except OSError as error:
        reason = str(error.strerror)
        if not reason.startswith("cannot write"):
            reason = f"cannot write {path}: {reason}"
        raise reworded(error, f"tc.save {reason}", path) from error


def _metadata(metadata: object) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError(f"metadata= takes a dict of strings to strings, got {metadata!r:.80}")
    if METADATA_KEY in metadata:
        raise ValueError(f"metadata= cannot hold {METADATA_KEY!r}: treeclass writes it")
    return dict(metadata)


def _export_plan(tree: object, rules: object, writer: CheckpointWriter) -> list[OutTensor]:
    """The tensors of an export to another library's layout, checked before writing."""
    # written by its caller alone, reading each array whole: on several processes, only a
    # fully addressable or fully replicated array can be
    unreadable = [
        path_str(tree, path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if isinstance(leaf, jax.Array)
        and not (leaf.is_fully_addressable or leaf.is_fully_replicated)
    ]
    if unreadable:
        raise ValueError(
            "tc.save with rules= is written by the process that calls it, which reads every "
            f"array whole; {listed(unreadable, 3)} neither lives on this process's "
            "devices alone nor is replicated: gather it first (jax.experimental."
            "multihost_utils.process_allgather, or a replicated sharding), or save "
            "treeclass's own layout, which every process writes together"
        )
    out = []
    for tensor in export(tree, _compiled(rules, "tc.save"), "tc.save"):
        if not writer.can_store(tensor.dtype):
            raise ValueError(
                f"{tensor.name!r} would be {tensor.dtype}, which safetensors has no name for"
            )
        nbytes = tensor.dtype.itemsize * math.prod(tensor.shape)
        data = functools.partial(_foreign_bytes, tensor)
        out.append(OutTensor(tensor.name, tensor.dtype, tensor.shape, nbytes, data))
    return out


def _foreign_bytes(tensor: ForeignTensor) -> np.ndarray:
    return tensor_bytes(tensor.compute())


def _leaf_bytes(tensor: PlannedTensor, path: str) -> np.ndarray:
    try:
        return tensor_bytes(tensor.value)
    except Exception as error:  # a deleted (donated) array, a failed device transfer
        message = f"tc.save cannot write {path}: reading {tensor.where} failed: {error}"
        try:
            renamed = type(error)(message)
        except Exception:  # an exception type that takes other arguments
            renamed = RuntimeError(message)
        raise renamed from error


@overload
def load(
    path: str | os.PathLike,
    like: _T,
    *,
    strict: Literal[True] = True,
    dry_run: Literal[False] = False,
    **options: Unpack[_LoadOptions],
) -> _T: ...
@overload
def load(
    path: str | os.PathLike,
    like: _T,
    *,
    strict: Literal[False],
    dry_run: Literal[False] = False,
    **options: Unpack[_LoadOptions],
) -> tuple[_T, LoadReport]: ...
@overload
def load(
    path: str | os.PathLike,
    like: PyTree,
    *,
    strict: bool = True,
    dry_run: Literal[True],
    **options: Unpack[_LoadOptions],
) -> LoadReport: ...
@overload
def load(
    path: str | os.PathLike,
    like: PyTree,
    *,
    strict: bool,
    dry_run: bool = False,
    **options: Unpack[_LoadOptions],
) -> Any: ...
def load(
    path: str | os.PathLike,
    like: PyTree,
    *,
    strict: bool = True,
    rules: object = None,
    where: object = None,
    missing: Missing | None = None,
    unexpected: Unexpected | None = None,
    dry_run: bool = False,
    format: Format | None = None,
) -> Any:
    """Load the checkpoint at `path` into the template `like`.

    The template gives the structure, what is frozen, and every value the file does not
    hold (functions, objects); the file gives the data, and is checked against the
    template's static values. Arrays take the template's type: numpy for a numpy leaf,
    else a `jax.Array` with the template leaf's sharding (an abstract template's too: each
    process reads only the bytes of its own shards) or on the default device.

    **Arguments**

    - `path`: a safetensors file, sharded safetensors (its `*.index.json`), a NumPy
      `.npz`, a flax `serialization.to_bytes` file (needs `msgpack`), an equinox
      `tree_serialise_leaves` file, or a folder holding one sharded checkpoint or one
      safetensors file (the reference guide, "Other formats").
    - `like`: a tree of the right structure: a model, or an abstract one
      (`jax.eval_shape(lambda: Model(...))`).
    - `strict`: if True (the default), any missing or unexpected key, shape, dtype or
      type mismatch, or differing static value raises one `ValueError` naming every key
      path. If False, restore what fits and report the rest.
    - `rules`: key rules mapping the file's names to the template's key paths: a dict
      `{source: target}` or a list of `(source, target)` / `(source, target, transform)`
      tuples, e.g. `("h.{i}.mlp.c_fc.weight", "blocks[{i}].up", lambda w: w.T)`, tried in
      order (the checkpoints guide, "Loading weights from elsewhere").
    - `where`: load only a selection of the template, `like.at["encoder"]` or any
      selector; the rest keeps its values, neither checked nor reported.
    - `missing`: `"error"`, `"keep"` (the template's value) or `"warn"` (keep, and warn)
      for template paths the file lacks; `"error"` by default when `strict`, and given
      so, an error with `strict=False` too.
    - `unexpected`: `"error"` or `"ignore"` for names in the file the template has no
      place for; defaults and `strict` as for `missing`.
    - `dry_run`: if True, return the `LoadReport` of what would be restored from where,
      checked from names, dtypes and shapes alone: no tensor is read.
    - `format`: `"safetensors"`, `"sharded"`, `"npz"`, `"flax"` or `"equinox"`; by
      default told by the file's extension, else by its first bytes.

    **Returns**

    The restored tree; with `strict=False`, a pair `(tree, report)` (a `LoadReport`);
    with `dry_run=True`, the report alone.

    **Raises**

    `ValueError` for a load that does not fit, listing every problem and the fixes that
    fit them (a non-strict load that could have restored more warns with them); for a
    corrupted file, or one of no format `load` reads; and naming the leaves of an
    abstract template the file did not fill. `ImportError` for a flax file without
    `msgpack`.

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
    assert tc.is_tree_equal(restored, model)
    ```
    """
    options = dict(strict=strict, missing=missing, unexpected=unexpected, dry_run=dry_run)
    source = open_source(os.fspath(path), like, format)
    try:
        return _restore(
            like, migrate(SourceCatalog(source), like), "tc.load", rules, where, **options
        )
    finally:
        source.close()
