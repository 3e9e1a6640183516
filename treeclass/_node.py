"""The TreeClass node contract: how an instance is stored, sealed, flattened and rebuilt.

Every other module asks this one what it needs of a TreeClass instance; none reads the
private state itself. The invariants (storage, the class record, shapes and interned
layouts, sealing, pending layouts): docs/architecture.md, "How an instance is kept".
"""

from __future__ import annotations

import functools
import operator
import os
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import numpy as np

from . import _codegen
from ._values import PLAIN_TYPES, ByIdentity
from ._values import hashable_key as value_key

__all__ = [  # exactly the names other modules (and white-box tests) use: a test checks it
    "TreeNode",
    "GUARDS",
    "NOTHING",
    "attach_info",
    "attributes",
    "child",
    "child_names",
    "children",
    "fields_of",
    "guard_field",
    "info",
    "is_sealed",
    "is_treeclass",
    "live_layouts",
    "opened",
    "own_info",
    "rebuild",
    "refuse_write",
    "register",
    "replace_child",
    "replace_children",
    "reseal",
    "seal",
    "seal_after_error",
    "seal_like",
    "set_attributes",
    "set_flat",
    "set_layout",
    "static_names",
    "static_values",
    "treeclass_nodes",
    "unseal",
    "unsealed_copy",
]

Callbacks = tuple[Callable[[Any], Any], ...]  # a field's `on_setattr` / `on_getattr`

_IMMUTABLE_MSG = (
    "Cannot {action} attribute {name!r} of an immutable `{cls}` instance: TreeClass "
    "instances are frozen once `__init__` has returned. Make a changed copy instead:\n"
    "    before: {before}\n"
    "    after:  tree = tree.at[{name!r}].set(value)\n"
    "To run a method that mutates the instance, call it on a copy:\n"
    "    value, tree = tree.at['method_name'](*args, **kwargs)"
)
_UNHASHABLE_STATIC_MSG = (
    "Static field `{cls}.{name}` must be hashable, but got a value of type {type}: static "
    "values are part of the tree definition, which JAX hashes on every jit call.\n"
    "Make it hashable (e.g. a tuple instead of a list), or make it a leaf:\n"
    "    before: {name}: ... = tc.field(static=True)\n"
    "    after:  {name}: ... = tc.field()   # optionally frozen with tc.freeze"
)
_ARRAY_STATIC_MSG = (
    "Static field `{cls}.{name}` holds an array: it will be compared by identity, so an "
    "equal but distinct array retraces `jax.jit`. Make it a leaf, or freeze it with "
    "`tc.freeze`, which hashes the array's contents once."
)
_CHILD_COUNT_MSG = (
    "Cannot rebuild a `{cls}` from {got} children: its layout has {want} ({names}). The "
    "children must come from flattening a `{cls}` with this tree definition."
)


class TreeNode:
    """The storage of a TreeClass instance: its `__dict__` and the two sealing slots."""

    __slots__ = ("__dict__", "_tc_layout", "_tc_flat", "__weakref__")

    _tc_info: ClassVar[ClassInfo]  # set on each subclass by `attach_info`

    if not TYPE_CHECKING:  # hidden from type checkers, which would then accept any name

        def __getattr__(self, name: str) -> Any:
            # Only reached when normal lookup fails: an unsealed instance computes `_tc_flat`
            # on demand, a sealed one with a pending layout computes and keeps it, once.
            if name == "_tc_flat":
                pending = getattr(self, "_tc_layout", None)
                if type(pending) is Shape:
                    return _materialize(self, pending)
                return flat_of(self)
            if name == "_tc_layout":  # a fresh instance: its slot is not set until sealing
                return None
            raise AttributeError(f"`{type(self).__name__}` instance has no attribute {name!r}")


_DICT_SLOT = TreeNode.__dict__["__dict__"]
# The real `__dict__` slot under a second name: generated code reads `self._tc_dict`, a
# C-level descriptor call that (unlike the slot's bound `__get__`) pickles with the class.
TreeNode._tc_dict = _DICT_SLOT  # type: ignore[attr-defined]
attributes: Callable[[Any], dict[str, Any]] = _DICT_SLOT.__get__  # the real instance dict
set_attributes: Callable[[Any, dict[str, Any]], None] = _DICT_SLOT.__set__
_layout_slot = TreeNode.__dict__["_tc_layout"]
_flat_slot = TreeNode.__dict__["_tc_flat"]
set_layout = _set_layout = _layout_slot.__set__
set_flat = _set_flat = _flat_slot.__set__
_new = object.__new__


def is_treeclass(x: object) -> bool:
    """Whether `x` is a TreeClass instance (a C-level isinstance: `TreeNode` is a plain class)."""
    return isinstance(x, TreeNode)


def layout_of(node: object) -> Layout | None:
    """The layout of a sealed instance; `None` while it is unsealed."""
    layout = getattr(node, "_tc_layout", None)
    if type(layout) is Layout:
        return layout
    if type(layout) is Shape:
        return _materialize(node, layout)[1]
    return None


def _materialize(node: object, shape: Shape) -> tuple[tuple[Any, ...], Layout]:
    """Find the layout of a sealed instance whose layout was left pending, and keep it."""
    d = attributes(node)
    layout = shape.with_values(tuple(d[n] for n in shape.static_names))
    flat = (shape.get(d), layout)
    _set_flat(node, flat)
    _set_layout(node, layout)
    return flat


# -- shapes and layouts ------------------------------------------------------------------------


def _single(name: str) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    return lambda d: (d[name],)


class Shape:
    """What every layout with one attribute order shares: names, keys, getter, unflatten."""

    __slots__ = (
        "info",
        "names",
        "leaf_names",
        "static_names",
        "keys",
        "get",
        "build",
        "layout",
        "table",
        "swept",
        "__weakref__",
    )

    def __init__(self, info: ClassInfo, names: tuple[str, ...]) -> None:
        statics = info.static_names
        self.info = info
        self.names = names
        self.leaf_names = tuple(n for n in names if n not in statics)
        self.static_names = tuple(n for n in names if n in statics)
        self.keys = tuple(info.key_of(n) for n in self.leaf_names)
        count = len(self.leaf_names)
        if count == 0:
            self.get = lambda _: ()
        elif count == 1:
            self.get = _single(self.leaf_names[0])
        else:
            self.get = operator.itemgetter(*self.leaf_names)
        self.build = self.compile_build(inline=False)
        # the one layout of a shape without static values lives as long as the shape
        self.layout = None if self.static_names else Layout(self, (), ())
        # static values' keys -> weak reference to the interned layout (see `intern`)
        self.table: dict[Any, Any] = {}
        self.swept = 0  # the table's size after its last sweep of dead entries

    def compile_build(self, inline: bool) -> Callable[[Any, Any], Any]:
        cls = self.info.cls
        source = _codegen.render_build(self.names, self.leaf_names, inline_fixed=inline)
        # `fixed`: the shape's one layout (None while it is being made, or with statics)
        fixed = getattr(self, "layout", None)
        namespace = {
            "cls": cls,
            "shape": self,
            "fixed": fixed,
            "new": _new,
            "set_layout": _set_layout,
            "set_flat": _set_flat,
        }
        what = "unflatten" if not inline else "registered unflatten"
        label = f"{what} of {cls.__module__}.{cls.__qualname__}({', '.join(self.names)})"
        return _codegen.compile_function(source, "build", namespace, label)

    def with_values(self, values: tuple[Any, ...]) -> Layout:
        """The interned layout of this shape with these static values."""
        try:
            key = tuple(map(value_key, values))
        except TypeError:
            key = self.info.static_key_or_raise(self, values)
        ref = self.table.get(key)
        if ref is not None:
            layout = ref()
            if layout is not None:
                return layout
        return self.intern(values, key)

    def intern(self, values: tuple[Any, ...], key: tuple[Any, ...]) -> Layout:
        """The miss path of `with_values`, under the class's lock; a key holding an array
        is dropped as soon as its layout dies, so the class never keeps an array alive."""
        with self.info.lock:
            ref = self.table.get(key)
            layout = ref() if ref is not None else None
            if layout is None:
                table = self.table
                if len(table) > 2 * self.swept + 64:
                    for dead in [k for k, r in table.items() if r() is None]:
                        del table[dead]
                    self.swept = len(table)
                layout = Layout(self, values, key)
                if any(type(k) is ByIdentity for k in key):
                    table[key] = weakref.ref(layout, functools.partial(_forget_layout, table, key))
                else:
                    table[key] = weakref.ref(layout)
        return layout

    def __reduce__(self) -> tuple[Any, ...]:
        return (_shape_from_pickle, (self.info.cls, self.names))

    def __repr__(self) -> str:
        return f"Shape({self.info.cls.__name__}, {self.names})"


class Layout:
    """What flatten returns as auxiliary data: everything about an instance but its leaves."""

    __slots__ = ("shape", "values", "key", "keys", "build", "__weakref__")

    def __init__(self, shape: Shape, values: tuple[Any, ...], key: object) -> None:
        self.shape = shape
        self.values = values  # the static values, in the order of `shape.static_names`
        self.key = key
        self.keys = shape.keys
        self.build = shape.build

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is Layout and other.shape is self.shape and other.key == self.key
        )

    # JAX hashes every node's aux data on every jit dispatch (the cache key). Layouts are
    # interned, so equal layouts are the same object and the C-level identity hash is
    # consistent with `__eq__`; a Python `__hash__` here cost ~1.5% of a small train step.
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        shape = self.shape
        static = ", ".join(f"{k}={v!r}" for k, v in zip(shape.static_names, self.values))
        return f"{shape.info.cls.__name__}Layout(leaves={shape.leaf_names}, static=({static}))"

    def __reduce__(self) -> tuple[Any, ...]:
        # unpickling re-interns: a pickled tree definition comes back with the live layout
        return (_layout_from_pickle, (self.shape.info.cls, self.shape.names, self.values))


def _info_from_pickle(
    cls: type,
    fields: dict[str, Any],
    static_names: tuple[str, ...],
    setters: dict[str, Callbacks],
    token: bytes,
) -> ClassInfo:
    # `cls` is the live class when cloudpickle found it in this process: keep its record
    # (cloudpickle then sets it back on the class). A fresh skeleton class has a record of
    # its own, made by `__init_subclass__` with another token: take the description.
    live = cls.__dict__.get("_tc_info") if isinstance(cls, type) else None
    if type(live) is not ClassInfo:
        return ClassInfo(cls, fields, static_names, setters, token)
    if live.token != token:
        live.adopt(fields, static_names, setters, token)
    return live


def _shape_from_pickle(cls: type[TreeNode], names: tuple[str, ...]) -> Shape:
    return cls._tc_info.shape(names)


def _layout_from_pickle(
    cls: type[TreeNode], names: tuple[str, ...], values: tuple[Any, ...]
) -> Layout:
    shape = cls._tc_info.shape(names)
    return shape.layout if shape.layout is not None else shape.with_values(tuple(values))


class _Broken:
    """The layout of an instance whose `__init__` failed: sealed, but not a valid tree."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<layout of a failed __init__>"


_BROKEN = _Broken()


def _forget_layout(table: dict[Any, Any], key: object, ref: object) -> None:
    # a weakref callback: drop the table entry if it still holds this (dead) layout
    if table.get(key) is ref:
        table.pop(key, None)


class ClassInfo:
    """Everything kept about one TreeClass subclass (docs/architecture.md, "How an
    instance is kept")."""

    __slots__ = (
        "cls",
        "fields",
        "static_names",
        "setters",
        "shapes",
        "lock",
        "fixed_shape",
        "_keys",
        "_setter_kinds",
        "token",
    )

    def __init__(
        self,
        cls: type,
        fields: dict[str, Any],
        static_names: tuple[str, ...],
        setters: dict[str, Callbacks],
        token: bytes | None = None,
    ) -> None:
        self.cls = cls
        self.fields = fields
        self.static_names = static_names
        self.setters = setters
        self.token = os.urandom(16) if token is None else token
        self.shapes: dict[tuple[str, ...], Shape] = {}
        self.lock = threading.Lock()
        self.fixed_shape: Shape | None = None
        self._keys: dict[str, Any] = {}
        self._setter_kinds: dict[str, Any] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _info_from_pickle,
            (self.cls, self.fields, self.static_names, self.setters, self.token),
        )

    def adopt(
        self,
        fields: dict[str, Any],
        static_names: tuple[str, ...],
        setters: dict[str, Callbacks],
        token: bytes,
    ) -> None:
        """Take a pickled description into the skeleton record of a class cloudpickle
        shipped, in place (shapes already handed out see the real static names)."""
        with self.lock:
            self.fields, self.static_names, self.setters = fields, static_names, setters
            self.token = token
            self._setter_kinds = {}
            for names, shape in list(self.shapes.items()):
                if shape.static_names != tuple(n for n in names if n in static_names):
                    shape.layout = None  # rebuilt by `__init__` for the new static names
                    Shape.__init__(shape, self, names)

    def key_of(self, name: str) -> Any:
        """The `GetAttrKey` of an attribute, built once per class and name."""
        key = self._keys.get(name)
        if key is None:
            key = self._keys.setdefault(name, jax.tree_util.GetAttrKey(name))
        return key

    def shape(self, names: tuple[str, ...]) -> Shape:
        shape = self.shapes.get(names)
        if shape is None:
            with self.lock:
                shape = self.shapes.get(names)
                if shape is None:
                    shape = Shape(self, names)
                    _guard_names(self.cls, names)
                    self.shapes[names] = shape
        return shape

    def static_key_or_raise(self, shape: Shape, values: tuple[Any, ...]) -> tuple[Any, ...]:
        # the slow path of `Shape.with_values`: arrays (warned about, keyed by identity),
        # or an error naming the field of an unhashable value
        keys = []
        for name, value in zip(shape.static_names, values, strict=True):
            try:
                keys.append(self._static_key(value, name))
            except TypeError:
                raise TypeError(
                    _UNHASHABLE_STATIC_MSG.format(
                        cls=self.cls.__name__, name=name, type=type(value).__name__
                    )
                ) from None
        return tuple(keys)

    def _static_key(self, value: object, name: str) -> Any:
        if isinstance(value, (np.ndarray, jax.Array)):
            message = _ARRAY_STATIC_MSG.format(cls=self.cls.__name__, name=name)
            warnings.warn(message, stacklevel=_user_stacklevel())
            return ByIdentity(value)
        if isinstance(value, tuple):
            return (type(value), tuple(self._static_key(v, name) for v in value))
        return value_key(value)

    def layout_of_attributes(self, d: dict[str, Any]) -> Layout:
        shape = self.shape(tuple(d))
        if shape.layout is not None:
            return shape.layout
        return shape.with_values(tuple(d[n] for n in shape.static_names))

    def fix_shape(self, names: tuple[str, ...]) -> Shape:
        """Record the shape of a class whose generated `__init__` sets `names`."""
        self.fixed_shape = self.shape(names)
        return self.fixed_shape

    def setter_kind(self, name: str) -> Any:
        """`None` to store `name` in the instance dict, else the data descriptor to call."""
        try:
            return self._setter_kinds[name]
        except KeyError:
            pass
        found = _class_lookup(self.cls, name)
        # a property, say: setting goes through it, as in plain Python
        kind = found if _is_foreign_data_descriptor(found) else None
        self._setter_kinds[name] = kind
        return kind


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _user_stacklevel() -> int:
    """How far up the first frame outside treeclass (and its generated code) is."""
    package = _PACKAGE_DIR
    frame: types.FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and (
        frame.f_code.co_filename.startswith(package)
        or frame.f_code.co_filename.startswith("<treeclass ")
    ):
        frame = frame.f_back
        level += 1
    return level


# -- attribute guards --------------------------------------------------------------------------

NOTHING: Any = object()  # "no such attribute / no class-level value"


def _class_lookup(cls: type, name: str) -> Any:
    """What `cls.name` finds in the MRO, undecorated (like `inspect.getattr_static`)."""
    for base in cls.__mro__:
        if name in base.__dict__:
            return base.__dict__[name]
    return NOTHING


def _is_foreign_data_descriptor(found: object) -> bool:
    """Whether a class attribute is a data descriptor (a property) other than our guards."""
    kind = type(found)
    return (
        found is not NOTHING
        and not isinstance(found, _Attribute)
        and (hasattr(kind, "__set__") or hasattr(kind, "__delete__"))
    )


class _Attribute:
    """The class-level guard of one attribute name: a data descriptor refusing writes to a
    sealed instance; reads fall back to the class-level value it displaced."""

    __slots__ = ("name", "fallback")

    def __init__(self, name: str, fallback: object = NOTHING) -> None:
        self.name = name
        self.fallback = fallback

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self._fallback(obj, owner)
        try:
            return attributes(obj)[self.name]
        except KeyError:
            return self._fallback(obj, owner)

    def _fallback(self, obj: object, owner: object) -> Any:
        """The class-level value read for a class (`obj` None) or an instance without one."""
        fallback = self.fallback
        if fallback is NOTHING:
            if obj is None:
                raise AttributeError(self.name)
            raise AttributeError(f"`{type(obj).__name__}` instance has no attribute {self.name!r}")
        get = getattr(type(fallback), "__get__", None)
        return fallback if get is None else get(fallback, obj, owner)

    def __set__(self, obj: object, value: object) -> None:
        if getattr(obj, "_tc_layout", None) is not None:
            before = f"object.__setattr__(tree, {self.name!r}, value)"
            raise _immutable_error(obj, self.name, "set", before)
        attributes(obj)[self.name] = value

    def __delete__(self, obj: object) -> None:
        if getattr(obj, "_tc_layout", None) is not None:
            before = f"object.__delattr__(tree, {self.name!r})"
            raise _immutable_error(obj, self.name, "delete", before)
        try:
            del attributes(obj)[self.name]
        except KeyError:
            raise AttributeError(
                f"`{type(obj).__name__}` instance has no attribute {self.name!r}"
            ) from None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.fallback))

    def __repr__(self) -> str:
        return f"<treeclass attribute {self.name!r}>"


class _GetterAttribute(_Attribute):
    """A guard that also applies a field's `on_getattr` callbacks on reads."""

    __slots__ = ("callbacks",)

    def __init__(self, name: str, fallback: object, callbacks: Callbacks) -> None:
        super().__init__(name, fallback)
        self.callbacks = callbacks

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self._fallback(obj, owner)
        try:
            value = attributes(obj)[self.name]
        except KeyError:
            return self._fallback(obj, owner)
        for callback in self.callbacks:
            value = callback(value)
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.fallback, self.callbacks))


GUARDS = (_Attribute,)


def guard_field(cls: type, name: str, default: object, on_getattr: tuple[Any, ...]) -> None:
    """Put the guard of a declared field on `cls`; `default` (or `NOTHING`) is its class value."""
    guard = _GetterAttribute(name, default, on_getattr) if on_getattr else _Attribute(name, default)
    type.__setattr__(cls, name, guard)


def _guard_names(cls: type, names: Sequence[str]) -> None:
    # Names a hand-written __init__ sets get their guard when an instance first has them,
    # keeping what the class had under the name; dunders and properties are left alone.
    for name in names:
        if name.startswith("__") and name.endswith("__"):
            continue
        found = _class_lookup(cls, name)
        if not isinstance(found, _Attribute) and not _is_foreign_data_descriptor(found):
            type.__setattr__(cls, name, _Attribute(name, found))


# -- sealing ----------------------------------------------------------------------------------


def flat_of(node: Any) -> tuple[tuple[Any, ...], Layout]:
    """Children and layout computed from the attributes (what sealing stores in `_tc_flat`)."""
    d = attributes(node)
    layout = type(node)._tc_info.layout_of_attributes(d)
    return layout.shape.get(d), layout


def seal(node: object) -> None:
    """Make `node` immutable, caching `(children, layout)`, in a fresh attribute dict."""
    set_attributes(node, dict(attributes(node)))
    flat = flat_of(node)
    _set_layout(node, flat[1])
    _set_flat(node, flat)


def seal_like(node: object, like: object) -> None:
    """Seal `node`, which has the names of the sealed `like` (plain statics: pending)."""
    layout = getattr(like, "_tc_layout", None)
    shape = layout if type(layout) is Shape else getattr(layout, "shape", None)
    if type(shape) is not Shape:
        seal(node)
        return
    d = attributes(node)
    if all(type(d[n]) in PLAIN_TYPES for n in shape.static_names):
        _set_layout(node, shape)
    else:
        _materialize(node, shape)


def seal_after_error(node: object) -> None:
    """Seal an instance whose `__init__` raised; if even that fails, mark it broken."""
    try:
        seal(node)
    except Exception:  # the original error matters more; stay immutable regardless
        _set_layout(node, _BROKEN)


def unseal(node: object) -> None:
    _set_layout(node, None)
    try:
        _flat_slot.__delete__(node)
    except AttributeError:  # never sealed: nothing cached
        pass


def is_sealed(node: object) -> bool:
    return getattr(node, "_tc_layout", None) is not None


def refuse_write(node: object, name: str, action: str) -> None:
    """Raise the immutability error for `tree.name = value` / `del tree.name`."""
    before = f"tree.{name} = value" if action == "set" else f"del tree.{name}"
    raise _immutable_error(node, name, action, before)


def _immutable_error(node: object, name: str, action: str, before: str) -> AttributeError:
    return AttributeError(
        _IMMUTABLE_MSG.format(action=action, name=name, cls=type(node).__name__, before=before)
    )


def unsealed_copy(tree: object) -> Any:
    """A copy of `tree` in which every TreeClass node may be mutated (and arrays are copies)."""
    # a NumPy array is mutable in place: a method of the copy must not write into the
    # caller's buffer (`self.buf[0] = -1`)
    copy = jax.tree_util.tree_map(lambda x: x.copy() if type(x) is np.ndarray else x, tree)
    for node in treeclass_nodes(copy):
        unseal(node)
    return copy


def reseal(tree: object) -> None:
    """Make every TreeClass node of an unsealed copy immutable again."""
    for node in treeclass_nodes(tree):
        if getattr(node, "_tc_layout", None) is None:
            seal(node)


def treeclass_nodes(tree: object) -> Iterator[Any]:
    """Every TreeClass node of `tree` (itself included), parents before children."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, TreeNode):
            yield node
            found = jax.tree_util.tree_leaves(children(node), is_leaf=is_treeclass)
        else:  # only the root can be a plain pytree here
            found = jax.tree_util.tree_leaves(node, is_leaf=is_treeclass)
        stack.extend(x for x in reversed(found) if isinstance(x, TreeNode))


# -- the contract lower modules use -----------------------------------------------------------


def static_names(cls: type[TreeNode]) -> tuple[str, ...]:
    """The names of the declared static fields of a TreeClass subclass."""
    return cls._tc_info.static_names


def child_names(node: Any) -> tuple[str, ...]:
    """The names of a TreeClass instance's children, in flatten order."""
    layout = layout_of(node)
    if layout is not None:
        return layout.shape.leaf_names
    statics = type(node)._tc_info.static_names
    return tuple(n for n in attributes(node) if n not in statics)


def children(node: Any) -> tuple[Any, ...]:
    layout = layout_of(node)
    if layout is not None:
        return node._tc_flat[0]
    d = attributes(node)
    return tuple(d[n] for n in child_names(node))


def opened(node: Any) -> tuple[tuple[Any, ...], list[Any], tuple[str, ...]]:
    """`(key entries, children as a fresh list, child names)`, in one look at the layout."""
    layout = layout_of(node)
    if layout is not None:
        return layout.keys, list(node._tc_flat[0]), layout.shape.leaf_names
    names = child_names(node)
    key_of = type(node)._tc_info.key_of
    d = attributes(node)
    return tuple(key_of(n) for n in names), [d[n] for n in names], names


def static_values(node: Any) -> dict[str, Any]:
    """`{name: value}` of the static fields an instance has."""
    d = attributes(node)
    return {n: d[n] for n in type(node)._tc_info.static_names if n in d}


def child(node: Any, name: str) -> Any:
    """The child `name` of a TreeClass instance, or `NOTHING` when it has no such child."""
    d = attributes(node)
    if name in d and name not in type(node)._tc_info.static_names:
        return d[name]
    return NOTHING


def replace_children(node: object, changes: dict[str, Any]) -> Any:
    """A copy of `node`, sealed like it, with some children (by name) replaced."""
    return _copy_with(node, dict(attributes(node), **changes))


def replace_child(node: object, name: str, value: object) -> Any:
    """A copy of `node` with its child `name` replaced by `value` (`.at`'s one-key path)."""
    state = dict(attributes(node))
    state[name] = value
    return _copy_with(node, state)


def _copy_with(node: object, state: dict[str, Any]) -> Any:
    """A node of `node`'s type and layout holding `state` (the same names as `node`'s)."""
    tree = _new(type(node))
    set_attributes(tree, state)
    layout = getattr(node, "_tc_layout", None)
    _set_layout(tree, layout)
    if type(layout) is Layout:
        _set_flat(tree, (layout.shape.get(state), layout))
    return tree


def rebuild(node: object, new_children: Sequence[Any]) -> Any:
    """`node` with all its children replaced, in `child_names(node)` order."""
    layout = layout_of(node)
    if layout is not None:
        if len(new_children) != len(layout.keys):
            names = ", ".join(layout.shape.leaf_names)
            cls, got, want = type(node).__name__, len(new_children), len(layout.keys)
            raise ValueError(_CHILD_COUNT_MSG.format(cls=cls, got=got, want=want, names=names))
        return layout.build(layout, tuple(new_children))
    return replace_children(node, dict(zip(child_names(node), new_children, strict=True)))


# -- registration with JAX ---------------------------------------------------------------------

# Flatten is a C-level read of `_tc_flat` (an unsealed instance falls through to
# `TreeNode.__getattr__`): no Python frame per node on jit dispatch.
_flatten = operator.attrgetter("_tc_flat")


def _flatten_with_keys(tree: Any) -> tuple[list[tuple[Any, Any]], Layout]:
    children, layout = tree._tc_flat
    # equal lengths by construction; `strict=` would cost a keyword parse per node
    return list(zip(layout.keys, children)), layout  # noqa: B905


def _unflatten(layout: Layout, children: object) -> Any:
    return layout.build(layout, children)


def register(cls: type[TreeNode]) -> None:
    """Register `cls` with JAX; its unflatten inlines the class's fixed shape, if it has one."""
    shape = cls._tc_info.fixed_shape
    unflatten = _unflatten if shape is None else shape.compile_build(inline=True)
    jax.tree_util.register_pytree_with_keys(cls, _flatten_with_keys, unflatten, _flatten)


def live_layouts(cls: type[TreeNode]) -> dict[Any, Layout]:
    """The interned layouts with static values of `cls` alive now, by `(shape, key)` (tests)."""
    out = {}
    for shape in list(cls._tc_info.shapes.values()):
        for key, ref in list(shape.table.items()):
            layout = ref()
            if layout is not None:
                out[(shape, key)] = layout
    return out


def fields_of(cls: type[TreeNode]) -> dict[str, Any]:
    """The `Field`s of a TreeClass subclass by name (statics and `repr=False` ones too)."""
    return cls._tc_info.fields


def attach_info(
    cls: type,
    fields: dict[str, Any],
    static_names: tuple[str, ...],
    setters: dict[str, Callbacks],
) -> ClassInfo:
    """Create the record of a new TreeClass subclass and keep it on the class."""
    info = ClassInfo(cls, fields, static_names, setters)
    type.__setattr__(cls, "_tc_info", info)
    return info


def info(node: Any) -> ClassInfo:
    """The record of a TreeClass instance's class."""
    return type(node)._tc_info


def own_info(cls: type) -> ClassInfo | None:
    """The record of `cls` itself (not inherited), or `None` for any other class."""
    info = cls.__dict__.get("_tc_info")
    return info if type(info) is ClassInfo else None
