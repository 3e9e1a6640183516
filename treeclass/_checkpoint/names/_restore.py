"""Restoring a template from a catalog: the checks, the policies, the report or the
error with its fixes, then each tensor read and placed where its template leaf lives."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from ..._values import is_prng_key, path_str, root_name
from ..files._files import reworded
from ..files._processes import place_by_slices
from ..files._source import is_weak, numpy_dtype
from ._catalog import Catalog
from ._check import KEEP, TAKE, Checker, to_number
from ._fixes import Fixes, listed
from ._walk import NUMBER, NUMBERS, STATIC, TENSOR, Entry, entries, walk

_UNFILLED = (
    "{source} leaves {paths} of the abstract template without a value: a "
    "jax.ShapeDtypeStruct has no value to keep, so each path of an abstract template "
    "must come from the checkpoint. Give those paths values (a template built with "
    "concrete arrays keeps its own), or make the checkpoint fill them (rules=)."
)
_DOES_NOT_FIT = "{source} does not fit the template `{root}`; {count} problem{s}:\n{lines}\n{fixes}"

MISSING_POLICIES = ("error", "keep", "warn")
UNEXPECTED_POLICIES = ("error", "ignore")


def restore(
    like: Any,
    source: Catalog,
    strict: bool,
    action: str,
    *,
    selected: Callable[[tuple, str], bool] | None = None,
    missing: str | None = None,
    unexpected: str | None = None,
    dry_run: bool = False,
) -> Any:
    """`like` with its data from `source`: the tree, or `(tree, report)` if not `strict`."""
    missing = missing or ("error" if strict else "keep")
    unexpected = unexpected or ("error" if strict else "ignore")
    if missing not in MISSING_POLICIES or unexpected not in UNEXPECTED_POLICIES:
        raise ValueError(
            f"{action}: missing= takes one of {MISSING_POLICIES} and unexpected= one of "
            f"{UNEXPECTED_POLICIES}; got missing={missing!r}, unexpected={unexpected!r}"
        )
    found = entries(like, action, source.call.replace("like", "value"))
    checker = Checker(like, source, dry_run)
    decisions = [
        checker.decide(entry, selected is None or selected(entry.node, entry.kind))
        for entry in found
    ]
    report = checker.finish(found, decisions, source.problems)
    if dry_run:
        return report
    # strict raises for every problem its policies do not waive; a non-strict load only for
    # the kinds a policy asks to raise for explicitly (`missing="error"`)
    problems = [
        line
        for line in report.messages
        if (missing == "error" if line.startswith("missing ") else True)
        and (unexpected == "error" if line.startswith("unexpected ") else True)
        and (strict or line.startswith(("missing ", "unexpected ")))
    ]
    unfilled = [
        path_str(like, e.path)
        for e, d in zip(found, decisions)
        if d == KEEP and e.kind != STATIC and isinstance(e.value, jax.ShapeDtypeStruct)
    ]
    if unfilled and not problems:  # (else the error below names them)
        raise ValueError(_UNFILLED.format(source=source.title, paths=listed(unfilled)))
    if missing == "warn" and report.missing:
        lines = [line for line in report.messages if line.startswith("missing ")]
        warnings.warn(
            f"{source.title}: {len(lines)} template path(s) kept their initial values:\n"
            + "\n".join("  " + line for line in lines),
            stacklevel=3,
        )
    fixes = Fixes(like, source, checker, missing, unexpected)
    if problems:
        count = len(problems)
        raise ValueError(
            _DOES_NOT_FIT.format(
                source=source.title,
                root=root_name(like),
                count=count,
                s="" if count == 1 else "s",
                lines="\n".join("  " + line for line in problems),
                fixes=fixes.text(),
            )
        )
    if not strict:
        fixes.warn(report)
    unholdable = [
        f"{path_str(like, e.path)} ({e.value.dtype}, on {platform})"
        for e, d in zip(found, decisions)
        if d == TAKE and (platform := _unholdable_on(e.value)) is not None
    ]
    if unholdable:  # before any tensor is read or placed
        raise ValueError(_UNHOLDABLE.format(source=source.title, paths=listed(unholdable)))
    # static values are checked above and never restored (nor visited part by part)
    steps = iter([(e, d) for e, d in zip(found, decisions) if e.kind != STATIC])

    def visit(path: tuple, kind: str, value: Any) -> Any:
        if kind == STATIC:
            return value
        entry, decision = next(steps)
        if decision != TAKE:
            return value
        try:
            fetched = _fetch(source, entry, value)
        except ValueError as error:  # bytes the checks could not see before reading them
            raise ValueError(f"{error} (restoring {path_str(like, path)})") from None
        except OSError as error:  # reading failed: the same error, saying what it was for
            where = f"{error.strerror} (restoring {path_str(like, path)})"
            raise reworded(error, where, error.filename) from error
        if entry.category == TENSOR:
            if type(fetched) in NUMBERS:
                return fetched
            weak = getattr(source.stored(entry.name), "weak", None)  # None: the file does not say
            return _place(value, fetched, is_weak(value) if weak is None else weak)
        if entry.category == NUMBER:
            return to_number(value, fetched)
        return fetched

    tree = walk(like, visit, rebuild=True)
    return tree if strict else (tree, report)


# Dtypes a backend cannot hold, where putting one there does not fail but ends the process
# (measured: `jnp.asarray` of an int2 or uint2 array aborts with signal 6 on a TPU v5e,
# JAX 0.10.2; int4, float4 and the float8 kinds are held). A template of such a dtype can
# only be abstract there, so a load refuses it before anything reaches the device.
DEVICE_CANNOT_HOLD: dict[str, frozenset[str]] = {"tpu": frozenset({"int2", "uint2"})}

_UNHOLDABLE = (
    "{source}: cannot restore {paths}: the device cannot hold that dtype (putting such an "
    "array there ends the process). Load into NumPy instead (a template of np.ndarray or "
    "np.zeros of that dtype keeps the values on the host), or convert it with a key rule "
    "transform, e.g. (name, name, lambda w: w.astype(np.int8)), into a template of int8."
)


def _unholdable_on(template: object) -> str | None:
    if not isinstance(template, (jax.Array, jax.ShapeDtypeStruct)) or is_prng_key(template):
        return None  # (NumPy templates stay on the host; key arrays hold no such dtype)
    name = np.dtype(template.dtype).name
    if not any(name in names for names in DEVICE_CANNOT_HOLD.values()):
        return None  # asked of every restored leaf: no device lookup in the common case
    devices = getattr(template.sharding, "device_set", None)
    platforms = {d.platform for d in devices} if devices else {jax.default_backend()}
    return next((p for p in sorted(platforms) if name in DEVICE_CANNOT_HOLD.get(p, ())), None)


def _sharding_of(template: object) -> Any:
    """The sharding a restored array takes from its template, or None (the default device)."""
    if isinstance(template, jax.ShapeDtypeStruct):
        return template.sharding
    if isinstance(template, jax.Array) and not isinstance(template, Tracer):
        if template.committed or len(template.sharding.device_set) > 1:
            return template.sharding
    return None


def _fetch(source: Catalog, entry: Entry, template: Any) -> Any:
    """The data of `entry`, read shard by shard for a template over several devices."""
    placed = getattr(source, "fetch_placed", None)  # (a stacked leaf assembled in place)
    if placed is not None and entry.category == TENSOR:
        value = placed(entry.name, template)
        if value is not None:
            return value
    sharding = _sharding_of(template) if entry.category == TENSOR else None
    ranges = getattr(source, "range_reader", None)
    if sharding is None or len(sharding.device_set) < 2 or ranges is None:
        return source.fetch(entry.name)
    read_range = ranges(entry.name)
    stored = source.stored(entry.name)
    dtype = None if stored is None else numpy_dtype(stored.dtype)
    if read_range is None or stored is None or dtype is None:
        return source.fetch(entry.name)
    return place_by_slices(tuple(stored.shape), dtype, sharding, read_range)


# the host bytes a load may leave to the garbage collector before collecting them
_RELEASE_BYTES = 2**20


class _Released:
    pending = 0


def release_host_copy(placed: object, nbytes: int) -> None:
    """Free the host buffers of tensors put on the device (`placed` the last): JAX's transfer
    leaves a young reference cycle alive, so once 1 MiB is put, collect generation 0."""
    _Released.pending += nbytes
    if _Released.pending >= _RELEASE_BYTES:
        _Released.pending = 0
        jax.block_until_ready(placed)
        gc.collect(0)


def _place(template: Any, value: Any, weak: bool) -> Any:
    """`value` as the template's type; a `jax.Array` weakly typed if `weak`."""
    if isinstance(template, (np.ndarray, np.generic)):  # its dtype: its byte order, too
        value = np.asarray(value, dtype=template.dtype)
        return value[()] if isinstance(template, np.generic) else value
    sharding = _sharding_of(template)
    placed = isinstance(value, jax.Array) and value.sharding == sharding  # (by `_fetch`)
    host = value
    if sharding is not None and not placed:
        value = jax.device_put(value, sharding)
    elif not isinstance(value, jax.Array):
        value = jax.device_put(value)
    if value is not host and not isinstance(host, jax.Array):
        release_host_copy(value, getattr(host, "nbytes", 0))
    if is_prng_key(value) or is_weak(value) == weak:  # (keys are never weakly typed)
        return value
    if not weak:  # a weakly typed array of a state dict, in a strong template
        return jax.lax.convert_element_type(value, value.dtype)
    # JAX has no public way to make an array of given data weakly typed (only Python
    # scalars, and `jnp.full` without a dtype, make them), so this uses the conversion its
    # own operations use. The one use of a private JAX name in treeclass's checkpoints.
    from jax._src.lax.lax import _convert_element_type

    return _convert_element_type(value, np.dtype(value.dtype), weak_type=True)
