"""`TreeClass`: a class whose instances are registered, immutable JAX pytrees.

How flattening stays cheap (see DESIGN.md section 5): an instance is immutable once its
`__init__` has run, so its *layout* (attribute names in assignment order, the values of
static fields, the `GetAttrKey` of every child) is computed once, when `__init__` ends,
interned per class and kept in a slot outside the instance `__dict__`. Flatten reads the
children with one precomputed getter and returns the layout itself as the auxiliary
data; JAX compares layouts by identity first, so equal trees hit the `jax.jit` cache
without any per-call hashing. Unflatten never calls `__init__`: it allocates with
`object.__new__` and fills `__dict__` directly.

The layout slot doubles as the mutability flag: `None` means "under construction" (or a
private copy inside `.at["method"]()`), anything else means sealed. Being per instance,
it is thread-safe without any global registry.
"""

from __future__ import annotations

import abc
import functools
import math
import operator
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np
from typing_extensions import dataclass_transform

from ._at import AtIndexer
from ._fields import MISSING, Field, add_field_note, build_init, collect_fields, field
from ._pprint import tree_repr, tree_str
from ._pprint_html import tree_html, treescope_repr
from ._util import is_tree_equal

__all__ = ["TreeClass"]

_IMMUTABLE_MSG = (
    "Cannot {action} attribute {name!r} of an immutable `{cls}` instance: TreeClass "
    "instances are frozen once `__init__` has returned. Make a changed copy instead:\n"
    "    before: {before}\n"
    "    after:  tree = tree.at[{name!r}].set(value)\n"
    "To run a method that mutates the instance, call it on a copy:\n"
    "    value, tree = tree.at['method_name'](*args, **kwargs)"
)
_SETSTATE_MSG = (
    "Cannot call `__setstate__` on an immutable `{cls}` instance: it would replace its "
    "attributes in place. Unpickle or copy it instead (`copy.deepcopy(tree)`)."
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
_SLOTS_MSG = (
    "`{cls}` defines `__slots__` {slots}: TreeClass instances keep their attributes in "
    "`__dict__` (flatten reads them from there), so slots would hide them. Remove "
    "`__slots__` from the class body."
)


class _ByIdentity:
    """Wraps an unhashable static value (an array) so that it compares by identity."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _typed_key(value: Any, cls: type, name: str) -> Any:
    # 1, 1.0 and True are equal and hash alike, but a static field must give back the
    # exact value it was given, so the interning key carries the types too.
    kind = type(value)
    if kind is tuple:
        return (tuple, tuple(_typed_key(item, cls, name) for item in value))
    if isinstance(value, (np.ndarray, jax.Array)):
        message = _ARRAY_STATIC_MSG.format(cls=cls.__name__, name=name)
        warnings.warn(message, stacklevel=_user_stacklevel())
        return _ByIdentity(value)
    if kind is float and value == 0.0:
        # 0.0 == -0.0 too, yet a trace that divides by the value must not be shared
        return (kind, value, math.copysign(1.0, value))
    return (kind, value)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _inside_treeclass(filename: str) -> bool:
    # generated __init__ code is named "<treeclass __init__ of ...>"
    return filename.startswith(_PACKAGE_DIR) or filename.startswith("<treeclass ")


def _user_stacklevel() -> int:
    # The call depth from a warning to user code varies (construction, unpickling, nested
    # tuples); point the warning at the first frame outside treeclass.
    frame = sys._getframe(2)  # the caller of the function that warns
    level = 2
    while frame is not None and _inside_treeclass(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


class _Layout:
    """What flatten returns as auxiliary data: everything about an instance but its leaves."""

    __slots__ = ("cls", "names", "leaf_names", "static", "keys", "get", "build", "key",
                 "__weakref__")

    def __init__(self, cls: type, names: tuple[str, ...], static: dict[str, Any], key: Any):
        self.cls = cls
        self.names = names  # every attribute, in assignment order
        self.leaf_names = tuple(n for n in names if n not in static)
        self.static = static
        key_of = cls._tc_keys
        self.keys = tuple(key_of(n) for n in self.leaf_names)
        count = len(self.leaf_names)
        if count == 0:
            self.get = lambda _: ()
        elif count == 1:
            only = self.leaf_names[0]
            self.get = lambda d: (d[only],)
        else:
            self.get = operator.itemgetter(*self.leaf_names)
        self.build = self._compile_build()
        self.key = key

    def _compile_build(self, fallback: bool = False) -> Callable[[Any, Any], Any]:
        """Generated unflatten code for this layout: `build(layout, children)`.

        Unflatten is on the hot path of every jit call. Straight-line stores into a fresh
        `__dict__` run about twice as fast as `dict(zip(names, children))`. With
        `fallback`, the function serves a whole class: it inlines this (the class's
        fixed) layout and hands any other layout to that layout's own `build`, which
        saves a Python call per node in the common case.
        """
        namespace: dict[str, Any] = {"new": _new, "cls": self.cls, "fixed": self,
                                     "set_layout": _layout_slot.__set__,
                                     "set_flat": _flat_slot.__set__}
        body = ["tree = new(cls)", "set_layout(tree, layout)",
                "set_flat(tree, (children, layout))", "state = tree.__dict__"]
        if self.leaf_names:
            targets = "".join(f"c{i}, " for i in range(len(self.leaf_names)))
            body.append(f"{targets}= children")
        leaf_index = {name: i for i, name in enumerate(self.leaf_names)}
        for i, name in enumerate(self.names):
            if name in leaf_index:
                body.append(f"state[{name!r}] = c{leaf_index[name]}")
            else:
                namespace[f"s{i}"] = self.static[name]
                body.append(f"state[{name!r}] = s{i}")
        body.append("return tree")
        if fallback:
            lines = ["def build(layout, children):", "    if layout is not fixed:",
                     "        return layout.build(layout, children)"]
        else:
            lines = ["def build(layout, children):"]
        lines += ["    " + line for line in body]
        exec("\n".join(lines), namespace)
        return namespace["build"]

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is _Layout and self.cls is other.cls and self.key == other.key
        )

    # JAX hashes every node's aux data on every jit dispatch (the cache key). Layouts are
    # interned, so equal layouts are the same object and the C-level identity hash is
    # consistent with `__eq__`; a Python `__hash__` here cost ~1.5% of a small train step.
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        static = ", ".join(f"{k}={v!r}" for k, v in self.static.items())
        return f"{self.cls.__name__}Layout(leaves={self.leaf_names}, static=({static}))"

    def __reduce__(self):
        return (_layout_for, (self.cls, self.names, self.static))


class _Broken:
    """The layout of an instance whose `__init__` failed: sealed, but not a valid tree."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<layout of a failed __init__>"


_BROKEN = _Broken()


def _layout_for(cls: type, names: tuple[str, ...], static: dict[str, Any]) -> _Layout:
    if static:
        try:
            key: Any = (names, tuple(_typed_key(v, cls, n) for n, v in static.items()))
            cached = cls._tc_layouts.get(key)
        except TypeError:
            for name, value in static.items():
                try:
                    hash(value)
                except TypeError:
                    raise TypeError(
                        _UNHASHABLE_STATIC_MSG.format(
                            cls=cls.__name__, name=name, type=type(value).__name__
                        )
                    ) from None
            raise
    else:
        key = names
        cached = cls._tc_layouts.get(key)
    if cached is not None:
        return cached
    layout = _Layout(cls, names, static, key)
    # Weak values: a layout lives as long as an instance, a treedef or the class (the
    # fixed layout) holds it, so varying static values (or static arrays, held by the
    # key) do not accumulate. setdefault keeps one layout per key (see `__hash__`).
    return cls._tc_layouts.setdefault(key, layout)


def _layout_of(tree: TreeClass) -> _Layout:
    cls = type(tree)
    d = tree.__dict__
    names = tuple(d)
    statics = cls._tc_static_names
    static = {n: d[n] for n in statics if n in d} if statics else {}
    return _layout_for(cls, names, static)


# Direct slot and __dict__ access, bypassing our __setattr__.
_set_dict = object.__setattr__
_new = object.__new__


def _flat_of(tree: TreeClass) -> tuple[tuple[Any, ...], _Layout]:
    """Children and layout computed from `__dict__` (what sealing stores in `_tc_flat`)."""
    layout = _layout_of(tree)
    return layout.get(tree.__dict__), layout


def _seal(tree: TreeClass) -> None:
    flat = _flat_of(tree)
    _layout_slot.__set__(tree, flat[1])
    _flat_slot.__set__(tree, flat)


def _unseal(tree: TreeClass) -> None:
    _layout_slot.__set__(tree, None)
    try:
        _flat_slot.__delete__(tree)
    except AttributeError:  # never sealed: nothing cached
        pass


def _seal_after_error(tree: TreeClass) -> None:
    try:
        _seal(tree)
    except Exception:  # the original error matters more; stay immutable regardless
        _layout_slot.__set__(tree, _BROKEN)


class _Sealing(NamedTuple):
    """What a generated `__init__` needs from this module (see `_fields.build_init`)."""

    seal: Callable[[Any], None]
    seal_after_error: Callable[[Any], None]
    fixed_layout: Callable[[type, tuple[str, ...]], tuple[Any, Any, Any]]


def _fixed_layout(cls: type, names: tuple[str, ...]) -> tuple[_Layout, Any, Any]:
    layout = _layout_for(cls, names, {})
    setattr_type(cls, "_tc_fixed_layout", layout)  # `_register` inlines it in unflatten
    return layout, _layout_slot.__set__, _flat_slot.__set__


def _sealing_init(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a hand-written (or inherited foreign) `__init__` so that it seals on return.

    Only the outermost `__init__` seals: a parent's, reached through `super().__init__`,
    sees that `type(self).__init__` is not itself and leaves sealing to its caller.
    """

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
            if type(self).__init__ is __init__:
                _seal(self)  # inside the try: see `_with_sealing` in _fields.py
        except BaseException:
            if type(self).__init__ is __init__:
                _seal_after_error(self)
            raise

    __init__.__tc_sealing__ = True
    return __init__


# Flatten is a C-level attribute read: a sealed instance keeps `(children, layout)`
# in its `_tc_flat` slot (immutability makes that safe), and an unsealed one, whose slot is
# empty, falls through to `TreeClass.__getattr__`, which computes it. This takes the
# Python frame out of every node flattened on every jit dispatch.
_flatten = operator.attrgetter("_tc_flat")


def _register(cls: type) -> None:
    def flatten_with_keys(tree: Any) -> tuple[list[tuple[Any, Any]], _Layout]:
        children, layout = tree._tc_flat
        # equal lengths by construction; `strict=` would cost a keyword parse per node
        return list(zip(layout.keys, children)), layout  # noqa: B905

    def unflatten(layout: _Layout, children: Any) -> Any:
        return layout.build(layout, children)

    fixed = cls.__dict__.get("_tc_fixed_layout")
    if fixed is not None:  # see `_Layout._compile_build`
        unflatten = fixed._compile_build(fallback=True)
    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, _flatten)


class _FieldGetter:
    """Class attribute for a field with `on_getattr`: applies the callbacks on reads."""

    __slots__ = ("name", "callbacks", "default")

    def __init__(self, item: Field) -> None:
        self.name = item.name
        self.callbacks = item.on_getattr
        self.default = item.default

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            if self.default is MISSING:
                raise AttributeError(self.name)
            return self.default
        try:
            value = obj.__dict__[self.name]
        except KeyError:
            raise AttributeError(
                f"`{type(obj).__name__}` instance has no attribute {self.name!r}"
            ) from None
        for callback in self.callbacks:
            value = callback(value)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        TreeClass.__setattr__(obj, self.name, value)

    def __delete__(self, obj: Any) -> None:
        TreeClass.__delattr__(obj, self.name)


@dataclass_transform(field_specifiers=(field, Field))
# The metaclass is plain ABCMeta (so `abc.abstractmethod` works), with no `__call__` of
# ours: construction is the C-level `type.__call__`, and `__init__` seals the instance
# itself (the generated one inline, a hand-written one through `_sealing_init`).
class TreeClass(metaclass=abc.ABCMeta):
    """Base class for classes whose instances are JAX pytrees.

    Subclassing registers the class with `jax.tree_util` (keyed by `GetAttrKey`); the
    children are the instance attributes in assignment order, except fields declared
    with `field(static=True)`, which live in the tree definition. Annotated fields give a
    generated `__init__` unless the class defines one. Instances are immutable after
    `__init__`: edit them with `.at[...]`.

    **Class keywords**

    - `leafwise=True`: add leafwise arithmetic and comparison operators
      (see `treeclass.leafwise`).

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    class Linear(tc.TreeClass):
        weight: jax.Array
        bias: jax.Array
        name: str = tc.field(default="linear", static=True)

    layer = Linear(jnp.ones((2, 2)), jnp.zeros(2))
    assert len(jax.tree_util.tree_leaves(layer)) == 2
    layer = layer.at["bias"].set(1.0)
    ```
    """

    __slots__ = ("_tc_layout", "_tc_flat", "__weakref__")

    # filled per subclass by __init_subclass__
    _tc_fields: dict[str, Field] = {}
    _tc_static_names: tuple[str, ...] = ()
    _tc_setters: dict[str, tuple[Callable[[Any], Any], ...]] = {}
    _tc_layouts: weakref.WeakValueDictionary[Any, _Layout]

    def __init_subclass__(cls, *, leafwise: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        slots = cls.__dict__.get("__slots__", ())
        slots = (slots,) if isinstance(slots, str) else tuple(slots)
        if cls.__dictoffset__ == 0 or set(slots) - {"__dict__", "__weakref__"}:
            raise TypeError(_SLOTS_MSG.format(cls=cls.__name__, slots=slots))
        items = collect_fields(cls, marked_bases_only=True)
        own = set(cls.__dict__.get("__annotations__", {})) & set(items)
        for name in own:
            item = items[name]
            if item.on_getattr and item.kind != "CLASS_VAR":
                setattr_type(cls, name, _FieldGetter(item))
            elif item.default is not MISSING:
                setattr_type(cls, name, item.default)  # `Tree.a` reads the default
            elif isinstance(cls.__dict__.get(name), Field):
                delattr(cls, name)
            if name not in cls.__dict__ and _inherited_getter(cls, name):
                # a redefinition without `on_getattr` must not keep the parent's getter
                setattr_type(cls, name, _FieldGetter(item))
        setattr_type(cls, "_tc_fields", items)
        instance_fields = [f for f in items.values() if f.kind != "CLASS_VAR"]
        setattr_type(cls, "_tc_static_names", tuple(f.name for f in instance_fields if f.static))
        setattr_type(
            cls, "_tc_setters", {f.name: f.on_setattr for f in instance_fields if f.on_setattr}
        )
        setattr_type(cls, "_tc_layouts", weakref.WeakValueDictionary())
        setattr_type(cls, "_tc_keys", _key_factory())

        if "__init__" in cls.__dict__:
            if not getattr(cls.__dict__["__init__"], "__tc_generated__", False):
                cls.__init__ = _sealing_init(cls.__dict__["__init__"])
        else:
            inherited = cls.__init__
            inherited_is_generated = getattr(inherited, "__tc_generated__", False)
            if own or inherited_is_generated or inherited is object.__init__:
                cls.__init__ = build_init(cls, items, through_setattr=False)
            elif not getattr(inherited, "__tc_sealing__", False):
                # an __init__ from a plain mixin: it must seal too
                cls.__init__ = _sealing_init(inherited)
        _register(cls)
        if leafwise:
            from ._leafwise import leafwise as make_leafwise

            make_leafwise(cls)

    # -- immutability ------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_tc_layout", None) is not None:
            raise AttributeError(
                _IMMUTABLE_MSG.format(
                    action="set", name=name, cls=type(self).__name__,
                    before=f"tree.{name} = value",
                )
            )
        callbacks = type(self)._tc_setters.get(name)
        if callbacks:
            try:
                for callback in callbacks:
                    value = callback(value)
            except Exception as error:
                add_field_note(error, self, name)
                raise
        self.__dict__[name] = value

    def __delattr__(self, name: str) -> None:
        if getattr(self, "_tc_layout", None) is not None:
            raise AttributeError(
                _IMMUTABLE_MSG.format(
                    action="delete", name=name, cls=type(self).__name__,
                    before=f"del tree.{name}",
                )
            )
        try:
            del self.__dict__[name]
        except KeyError:
            raise AttributeError(
                f"`{type(self).__name__}` instance has no attribute {name!r}"
            ) from None

    # -- the indexer -------------------------------------------------------------------

    @property
    def at(self) -> AtIndexer:
        """The `.at[...]` indexer: select parts of this tree and get a new tree back."""
        return AtIndexer(self)

    # -- dunders -----------------------------------------------------------------------

    def __repr__(self) -> str:
        return tree_repr(self)

    def __str__(self) -> str:
        return tree_str(self)

    def _repr_html_(self) -> str:
        return tree_html(self)

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        return treescope_repr(self, path, subtree_renderer)

    def __eq__(self, other: object) -> Any:
        return is_tree_equal(self, other)

    def __hash__(self) -> int:
        leaves, treedef = jax.tree_util.tree_flatten_with_path(self)
        try:
            return hash((treedef, *(leaf for _, leaf in leaves)))
        except TypeError:
            for path, leaf in leaves:
                try:
                    hash(leaf)
                except TypeError:
                    raise TypeError(
                        f"Cannot hash a `{type(self).__name__}`: the leaf at "
                        f"{type(self).__name__}{jax.tree_util.keystr(path)} is an unhashable "
                        f"{type(leaf).__name__}. Freeze it (`tc.freeze`) to hash by value."
                    ) from None
            raise

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails. An unsealed instance has no `_tc_flat`
        # yet (it is still changing): compute it on demand for flatten.
        if name == "_tc_flat":
            return _flat_of(self)
        if name == "_tc_layout":  # a fresh instance: its slot is not set until sealing
            return None
        raise AttributeError(f"`{type(self).__name__}` instance has no attribute {name!r}")

    def __copy__(self) -> Any:
        return self._tc_replace({})

    def _tc_replace(self, changes: dict[str, Any]) -> Any:
        """A copy with some children replaced: the indexer's fast path for rebuilding.

        The names in `changes` must already be non-static attributes, so the layout is
        unchanged and the copy is sealed (or unsealed) exactly like `self`.
        """
        tree = _new(type(self))
        state = dict(self.__dict__)
        state.update(changes)
        _set_dict(tree, "__dict__", state)
        layout = getattr(self, "_tc_layout", None)
        _layout_slot.__set__(tree, layout)
        if type(layout) is _Layout:
            _flat_slot.__set__(tree, (layout.get(state), layout))
        return tree

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        if getattr(self, "_tc_layout", None) is not None:  # only fresh unpickled objects
            raise AttributeError(_SETSTATE_MSG.format(cls=type(self).__name__))
        _set_dict(self, "__dict__", dict(state))
        _seal(self)

    # -- support for `.at["method"](...)` ------------------------------------------------

    def _tc_unsealed_copy(self) -> Any:
        """A copy of this tree in which every TreeClass node may be mutated."""
        tree = jax.tree_util.tree_map(lambda x: x, self)
        for node in _treeclass_nodes(tree):
            _unseal(node)
        return tree

    def _tc_reseal(self) -> None:
        """Make every TreeClass node of this (unsealed copy) tree immutable again."""
        for node in _treeclass_nodes(self):
            if node._tc_layout is None:
                _seal(node)


def _inherited_getter(cls: type, name: str) -> bool:
    for base in cls.__mro__[1:]:
        if name in base.__dict__:
            return isinstance(base.__dict__[name], _FieldGetter)
    return False


def setattr_type(cls: type, name: str, value: Any) -> None:
    type.__setattr__(cls, name, value)


def _key_factory() -> Callable[[str], Any]:
    # one GetAttrKey per class and name, built on first use and then reused
    cache: dict[str, Any] = {}

    def key_of(name: str) -> Any:
        key = cache.get(name)
        if key is None:
            key = cache.setdefault(name, jax.tree_util.GetAttrKey(name))
        return key

    return key_of


def _treeclass_nodes(tree: Any) -> Iterator[TreeClass]:
    """Every TreeClass node of `tree` (itself included), parents before children."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, TreeClass):
            yield node
            statics = node._tc_static_names
            children = [v for k, v in node.__dict__.items() if k not in statics]
        else:
            children = [node]  # only the root can be a plain pytree here
        found = jax.tree_util.tree_leaves(children, is_leaf=_is_treeclass)
        stack.extend(x for x in reversed(found) if isinstance(x, TreeClass))


def _is_treeclass(node: Any) -> bool:
    return isinstance(node, TreeClass)


_layout_slot = TreeClass.__dict__["_tc_layout"]
_flat_slot = TreeClass.__dict__["_tc_flat"]
TreeClass._tc_sealing = _Sealing(_seal, _seal_after_error, _fixed_layout)
