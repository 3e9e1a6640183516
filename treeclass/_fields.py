"""Field declarations (`Field`, `field()`, `fields()`): a class's annotated attributes,
collected once, when the class is created, inherited ones first (a redefinition keeps the
original's place, as in `dataclasses`), defaults checked then; `_autoinit.py` uses them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import keyword
import types
from collections.abc import (
    Callable,
    Iterable,
    Mapping,
    MutableMapping,
    MutableSequence,
    MutableSet,
    Sequence,
)
from typing import Any, ClassVar, Literal, TypedDict, TypeVar, get_args, get_origin, overload

import jax
import numpy as np
from jax.core import Tracer
from typing_extensions import Unpack

from . import _node
from ._structure import describe
from ._util import add_leaf_note, equal_or_false

# the metadata key of `tc.field` that holds a declared role, and the roles a field declares
ROLE_KEY = "role"
FieldRole = Literal["state", "frozen"]
FIELD_ROLES: tuple[str, ...] = get_args(FieldRole)
_KNOWN_ROLES = ", ".join(f"'{role}'" for role in FIELD_ROLES)

_UNKNOWN_FIELD_ROLE_MSG = (
    "`role` must be one of {known}, got {role!r}:\n"
    "    state:  a value the forward pass updates (running statistics, counters, caches)\n"
    "    frozen: a pretrained value that is never trained (a traced leaf whose reads stop "
    "gradients)"
)
_ROLE_TWICE_MSG = (
    "`field` got role={role!r} and metadata role {other!r}; give the role once: "
    "`tc.field(role={role!r})`."
)


def stop_gradient_if_traced(value: object) -> Any:
    """`value` with its traced inexact leaves gradient-stopped: a frozen field's read."""
    if isinstance(value, Tracer):
        return _stop(value)
    if isinstance(value, (jax.Array, np.ndarray, int, float, str)) or value is None:
        return value
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if not any(isinstance(leaf, Tracer) for leaf in leaves):
        return value
    return treedef.unflatten([_stop(leaf) if isinstance(leaf, Tracer) else leaf for leaf in leaves])


# The ids of traced values whose gradient a stack stopped before its scan: their reads are
# left as they are, so a scan forwards the very value instead of saving a copy (speed only).
_STOPPED: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "treeclass_gradients_stopped", default=frozenset()
)


@contextlib.contextmanager
def gradients_stopped(values: Iterable[object]) -> Any:
    """Within the block, reads of a frozen field holding one of `values` add nothing."""
    token = _STOPPED.set(_STOPPED.get() | {id(v) for v in values})
    try:
        yield
    finally:
        _STOPPED.reset(token)


def _stop(x: object) -> Any:
    if id(x) in _STOPPED.get():
        return x
    dtype = getattr(x, "dtype", None)
    if dtype is not None and np.issubdtype(dtype, np.inexact):
        return jax.lax.stop_gradient(x)
    return x


# in the order Python requires in a signature
FieldKind = Literal["POS_ONLY", "POS_OR_KW", "VAR_POS", "KW_ONLY", "VAR_KW", "CLASS_VAR"]
KINDS: tuple[str, ...] = get_args(FieldKind)


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self):
        return "MISSING"


MISSING: Any = _Missing()

_NOT_BOOL_MSG = "`{arg}` must be a bool (True or False), got {value}."
_RESERVED_NAME_MSG = "{cls}: {a_what} cannot be named {name!r}: {why}."
_RENAME_FIELD = "Rename the field (an `alias` can set the `__init__` parameter name)."
_RENAME_ALIAS = "Choose another alias."
_RESERVED_NAMES = {
    "self": "it is the instance parameter of `__init__`",
    "__post_init__": "it is the hook called after `__init__`",
    "__annotations__": "it holds the class's annotations",
    "at": "it would hide the `.at` indexer",
    "replace": "it would hide the `.replace` method",
}
_DEFAULT_MSG = (
    "{cls}.{name}: a default of type `{type}` is not allowed ({reason}).\n"
    "Use a factory instead:\n"
    "    before: {name}: {type} = {value}\n"
    "    after:  {name}: {type} = tc.field(factory=lambda: {value})"
)


def _as_callables(value: Any, argname: str) -> tuple[Callable[[Any], Any], ...]:
    if value is None:
        return ()
    items = tuple(value) if isinstance(value, Sequence) and not callable(value) else (value,)
    for item in items:
        if not callable(item):
            raise TypeError(
                f"`{argname}` must be a callable or a sequence of callables, got {describe(item)}."
            )
    return items


class Field:
    """The description of one field of a class, made by `field()` and returned by
    `fields()`; its attributes are read-only (`replace` makes a changed copy). In a plain
    class it is a descriptor (the classes API page).

    ```python
    import treeclass as tc

    class Tree(tc.TreeClass):
        a: int = tc.field(default=1, doc="a counter")

    (a,) = tc.fields(Tree)
    assert (a.name, a.default, a.doc, a.static) == ("a", 1, "a counter", False)
    assert a.replace(default=2).default == 2
    ```
    """

    # the slots, all set by `__init__` (`name` is `None` until the Field is in a class)
    name: str
    type: Any
    default: Any
    factory: Callable[[], Any] | None
    init: bool
    repr: bool
    kind: FieldKind
    alias: str | None
    on_setattr: tuple[Callable[[Any], Any], ...]
    on_getattr: tuple[Callable[[Any], Any], ...]
    static: bool
    metadata: Mapping[str, Any]
    doc: str
    __slots__ = tuple(__annotations__)  # the attributes above, in this order

    def __init__(
        self,
        *,
        name: str | None = None,
        type: object = None,
        default: object = MISSING,
        factory: Callable[[], Any] | None = None,
        init: bool = True,
        repr: bool = True,
        kind: str = "POS_OR_KW",
        alias: str | None = None,
        on_setattr: Sequence[Callable[[Any], Any]] | Callable[[Any], Any] | None = None,
        on_getattr: Sequence[Callable[[Any], Any]] | Callable[[Any], Any] | None = None,
        static: bool = False,
        metadata: Mapping[str, Any] | None = None,
        doc: str = "",
    ) -> None:
        for flag, value in (("init", init), ("repr", repr), ("static", static)):
            if not isinstance(value, bool):
                raise TypeError(_NOT_BOOL_MSG.format(arg=flag, value=describe(value)))
        if kind not in KINDS:
            raise ValueError(f"`kind` must be one of {KINDS}, got {kind!r}.")
        if default is not MISSING and factory is not None:
            raise TypeError("Pass either `default` or `factory` to `field`, not both.")
        if factory is not None and not callable(factory):
            raise TypeError(f"`factory` must be callable, got {describe(factory)}.")
        if alias is not None and not isinstance(alias, str):
            raise TypeError(f"`alias` must be a str, got {describe(alias)}.")
        if alias is not None and (not alias.isidentifier() or keyword.iskeyword(alias)):
            raise ValueError(
                f"`alias` must be a valid identifier and not a Python keyword, got {alias!r}: "
                "it is the name of an `__init__` parameter."
            )
        if not isinstance(doc, str):
            raise TypeError(f"`doc` must be a str, got {describe(doc)}.")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"`metadata` must be a mapping, got {describe(metadata)}.")
        on_set = _as_callables(on_setattr, "on_setattr")
        on_get = _as_callables(on_getattr, "on_getattr")
        mapping = types.MappingProxyType(dict(metadata or {}))
        if mapping.get(ROLE_KEY) == "frozen" and stop_gradient_if_traced not in on_get:
            # a frozen field's reads stop gradients: declared once, honoured by every
            # `__init__`, generated or hand-written (the class's guard runs `on_getattr`)
            on_get = (stop_gradient_if_traced, *on_get)
        values = (name, type, default, factory, init, repr, kind, alias, on_set, on_get)
        for slot, given in zip(Field.__slots__, (*values, static, mapping, doc), strict=True):
            object.__setattr__(self, slot, given)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Field objects are immutable; use `field.replace({name}=...)`.")

    def __reduce__(self) -> tuple[Any, ...]:
        # slots behind an immutable __setattr__: pickle by the constructor's arguments
        kwargs = {slot: getattr(self, slot) for slot in Field.__slots__}
        kwargs["metadata"] = dict(kwargs["metadata"])
        return (functools.partial(Field, **kwargs), ())

    def replace(self, **changes: object) -> Field:
        """Return a copy of this field with `changes` applied."""
        kwargs = {slot: getattr(self, slot) for slot in Field.__slots__}
        kwargs.update(changes)
        return Field(**kwargs)

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING or self.factory is not None

    def __repr__(self) -> str:
        # every setting, defaults included (PyTreeClass's style): it says all that it does
        shown = ", ".join(
            f"{slot}={_setting_repr(getattr(self, slot))}" for slot in Field.__slots__
        )
        return f"Field({shown})"

    # -- the descriptor: a Field in a plain class body (a TreeClass puts guards instead) --

    def __set_name__(self, owner: type, name: str) -> None:
        annotation = _own_annotations(owner).get(name)
        if self.name is None:  # still being set up: the class body names it
            object.__setattr__(self, "name", name)
            if self.type is None:
                object.__setattr__(self, "type", annotation)
        elif self.name != name:  # one Field object under two names: each gets its own
            setattr(owner, name, self.replace(name=name, type=annotation))

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self  # `Cls.x` is the Field, as `Cls.prop` is the property
        try:
            value = _instance_dict(instance)[self.name]
        except KeyError:
            if self.default is MISSING:
                raise AttributeError(
                    f"`{type_name(instance)}` instance has no attribute {self.name!r}"
                ) from None
            value = self.default  # never assigned: the default, as a class attribute reads
        for callback in self.on_getattr:
            value = callback(value)
        return value

    def __set__(self, instance: object, value: object) -> None:
        name = self._bound_name(instance, "set")
        _instance_dict(instance)[name] = run_setters(instance, name, self.on_setattr, value)

    def __delete__(self, instance: object) -> None:
        name = self._bound_name(instance, "delete")
        try:
            del _instance_dict(instance)[name]
        except KeyError:
            raise AttributeError(
                f"`{type_name(instance)}` instance has no attribute {name!r}"
            ) from None

    def _bound_name(self, instance: object, action: str) -> str:
        if self.name is None:
            raise TypeError(_UNNAMED_FIELD_MSG)
        if _node.is_sealed(instance):  # a TreeClass instance using a plain mixin's Field
            _node.refuse_write(instance, self.name, action)
        return self.name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Field):
            return NotImplemented
        return all(equal_or_false(getattr(self, s), getattr(other, s)) for s in Field.__slots__)

    __hash__ = object.__hash__


_UNNAMED_FIELD_MSG = (
    "This Field has no name: it works as a descriptor only when assigned in a class body.\n"
    "    before: Cls.x = tc.field(...)   # after the class was created\n"
    "    after:  class Cls:\n"
    "                x: int = tc.field(...)"
)


def _instance_dict(instance: object) -> dict[str, Any]:
    # a TreeClass's `__dict__` is a read-only view (reached through a plain mixin's Field)
    if isinstance(instance, _node.TreeNode):
        return _node.attributes(instance)
    return instance.__dict__


def type_name(value: object) -> str:
    # `type` is a parameter of `Field.__init__`, where the builtin is out of reach
    return type(value).__name__


def _setting_repr(value: object) -> str:
    if isinstance(value, types.MappingProxyType):
        return repr(dict(value))
    if isinstance(value, tuple) and all(callable(item) for item in value):
        return f"({', '.join(_setting_repr(item) for item in value)}{',' * (len(value) == 1)})"
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return value.__name__  # `int`, `positive`, `<lambda>`: not `<function ... at 0x...>`
    return repr(value)


# The overloads are what type checkers read (`field` is a `dataclass_transform` field
# specifier): with `default` or `factory` a field is optional in `__init__` and the value's
# type is checked against the annotation; `init` and `alias` are recognised too.
_T = TypeVar("_T")
_Callbacks = Sequence[Callable[[Any], Any]] | Callable[[Any], Any] | None


class _FieldOptions(TypedDict, total=False):
    init: bool
    repr: bool
    kind: FieldKind
    alias: str | None
    on_setattr: _Callbacks
    on_getattr: _Callbacks
    static: bool
    metadata: Mapping[str, Any] | None
    doc: str
    role: FieldRole | None


@overload
def field(*, default: _T, **options: Unpack[_FieldOptions]) -> _T: ...
@overload
def field(*, factory: Callable[[], _T], **options: Unpack[_FieldOptions]) -> _T: ...
@overload
def field(**options: Unpack[_FieldOptions]) -> Any: ...
def field(*, role: FieldRole | None = None, **options: Any) -> Any:
    """Describe a field of a `TreeClass` (or an `autoinit` class).

    **Arguments**

    - `default`: the default value; must not be a `list`, `dict` or `set` (use `factory`).
    - `factory`: a zero-argument callable that makes the default for each instance.
    - `init`: whether the field is a parameter of the generated `__init__` (with
      `init=False`, `__init__` sets it to its default, if it has one).
    - `repr`: whether the field is shown by `repr`.
    - `kind`: the parameter kind in the generated `__init__`: `"POS_ONLY"`, `"POS_OR_KW"`
      (the default), `"VAR_POS"` (`*args`, stored as a tuple), `"KW_ONLY"`, `"VAR_KW"`
      (`**kwargs`, stored as a dict) or `"CLASS_VAR"` (not an instance field at all).
    - `alias`: the name of the `__init__` parameter, when it differs from the field name.
    - `on_setattr`: a callable (or a sequence, applied in order) that validates or converts
      the value whenever the field is assigned (in `__init__`, or inside `.at["method"]`).
    - `on_getattr`: a callable (or a sequence) applied to the value on attribute reads
      (flattening sees the stored value).
    - `static`: store the value, hashable, in the tree definition instead of as a leaf
      (so it takes part in `==`, `hash` and the `jax.jit` cache key).
    - `metadata`: a mapping of extra information, kept read-only.
    - `doc`: a documentation string for the field.
    - `role`: `"state"` (values the forward pass updates: statistics, counters) or
      `"frozen"` (a pretrained value; traced reads stop gradients): the role of every leaf
      it holds (`tc.roles`; `metadata["role"]`), which `tc.optim.trainable` never trains.

    **Returns**

    A `Field`, to be assigned to an annotated class attribute.

    ```python
    import treeclass as tc

    class Tree(tc.TreeClass):
        a: int = tc.field(default=1, on_setattr=[int])
        name: str = tc.field(default="x", static=True)

    assert Tree(a=2.7).a == 2
    ```
    """
    given = sorted(options.keys() & {"name", "type"})  # the class body gives these
    if given:
        raise TypeError(f"field() got an unexpected keyword argument {given[0]!r}")
    item = Field(**options)
    if role is None:
        return item
    if role not in FIELD_ROLES:
        raise ValueError(_UNKNOWN_FIELD_ROLE_MSG.format(known=_KNOWN_ROLES, role=role))
    other = item.metadata.get(ROLE_KEY, role)
    if other != role:
        raise TypeError(_ROLE_TWICE_MSG.format(role=role, other=other))
    return item.replace(metadata={**item.metadata, ROLE_KEY: role})


_CLASSVAR_NAMES = ("ClassVar", "typing.ClassVar", "typing_extensions.ClassVar")


def _is_classvar(annotation: object) -> bool:
    if isinstance(annotation, str):  # `ClassVar`, `typing.ClassVar[int]`, ...
        return annotation.strip().partition("[")[0] in _CLASSVAR_NAMES
    return annotation is ClassVar or get_origin(annotation) is ClassVar


def _own_annotations(cls: type) -> dict[str, Any]:
    # `cls.__annotations__` would fall back to a parent's dict on older Pythons.
    return dict(cls.__dict__.get("__annotations__", {}))


def collect_fields(cls: type, *, marked_bases_only: bool = False) -> dict[str, Field]:
    """Fields of `cls` by name, in definition order, inherited ones first; with
    `marked_bases_only` (TreeClass), a plain mixin's annotations are not fields."""
    result: dict[str, Field] = {}
    for base in reversed(cls.__mro__):
        if base is object:
            continue
        cached = _cached_fields(base)
        if cached is not None and base is not cls:
            result.update(cached)
            continue
        if marked_bases_only and base is not cls:
            continue
        for name, annotation in _own_annotations(base).items():
            if _is_classvar(annotation):
                continue
            check_name(base, name, treeclass=marked_bases_only)
            value = base.__dict__.get(name, MISSING)
            if isinstance(value, Field):
                item = value.replace(name=name, type=annotation)
            # a __slots__ entry (no default), or a TreeClass field guard (cloudpickle)
            elif isinstance(value, (types.MemberDescriptorType, *_node.GUARDS)):
                item = Field(name=name, type=annotation)
            else:
                item = Field(name=name, type=annotation, default=value)
            _check_default(base, item)
            result[name] = item
    return result


def check_name(cls: type, name: str, *, treeclass: bool, what: str = "field") -> None:
    """Refuse a field (or alias) name that cannot be a parameter of a generated `__init__`."""
    if name in _RESERVED_NAMES and (treeclass and what == "field" or name not in ("at", "replace")):
        why = _RESERVED_NAMES[name]
    elif not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        why = "it is not a valid Python identifier (it must be an `__init__` parameter)"
    elif name.startswith("__") and name.endswith("__"):
        why = "dunder names are Python's own"
    elif name.startswith("__tc_") or (treeclass and name.startswith("_tc_")):
        why = "names starting with `_tc_` or `__tc_` are treeclass's own"
    else:
        return
    a_what, fix = ("a field", _RENAME_FIELD) if what == "field" else ("an alias", _RENAME_ALIAS)
    message = _RESERVED_NAME_MSG.format(cls=cls.__name__, a_what=a_what, name=name, why=why)
    raise ValueError(f"{message} {fix}")


# Where `autoinit` keeps a plain class's fields (a TreeClass: in its `ClassInfo`)
_PLAIN_FIELDS_ATTR = "_tc_autoinit_fields"


def _cached_fields(cls: type) -> dict[str, Field] | None:
    info = _node.own_info(cls)
    if info is not None:
        return info.fields
    return cls.__dict__.get(_PLAIN_FIELDS_ATTR)


# Types whose instances may not be field defaults, with the reason (`register_excluded_type`)
_EXCLUDED_DEFAULT_TYPES: dict[type, str | None] = {}

# any mutable container (list, dict, set, bytearray, deque, UserDict, array.array, ...)
_MUTABLE_CONTAINERS = (MutableSequence, MutableMapping, MutableSet, bytearray)
_NUMPY_DEFAULT_REASON = (
    "a NumPy array is a buffer that every instance would share, and that can change in "
    "place, even a read-only view of a writable one"
)


def _check_default(cls: type, item: Field) -> None:
    default, value = item.default, "..."
    if isinstance(default, _MUTABLE_CONTAINERS):
        reason, value = "it is mutable: every instance would share it", repr(default)
    elif _holds_numpy_array(default):
        reason = _NUMPY_DEFAULT_REASON
    else:
        found = [why for k, why in _EXCLUDED_DEFAULT_TYPES.items() if isinstance(default, k)]
        if not found:
            return
        reason = found[0] or "excluded with `tc.autoinit.register_excluded_type`"
    kind = type_name(default)
    raise TypeError(
        _DEFAULT_MSG.format(cls=cls.__name__, name=item.name, type=kind, reason=reason, value=value)
    )


def _holds_numpy_array(value: object) -> bool:
    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, (tuple, frozenset)):
        return any(_holds_numpy_array(item) for item in value)
    return False


def register_excluded_type(kind: type, reason: str | None = None) -> None:
    """Refuse field defaults of type `kind` (and its subclasses), saying `reason`.

    **Arguments**

    - `kind`: the type whose instances may not be field defaults.
    - `reason`: shown in the error, e.g. `"it is mutable"`.

    ```python
    import treeclass as tc

    class Registry: ...

    tc.autoinit.register_excluded_type(Registry, reason="it is shared mutable state")
    try:
        class Tree(tc.TreeClass):
            registry: Registry = Registry()
    except TypeError as error:
        assert "shared mutable state" in str(error)
    ```
    """
    if not isinstance(kind, type):
        raise TypeError(f"`register_excluded_type` expects a type, got {describe(kind)}.")
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"`reason` must be a str or None, got {describe(reason)}.")
    _EXCLUDED_DEFAULT_TYPES[kind] = reason


def fields(item: object) -> tuple[Field, ...]:
    """The fields of a `TreeClass` or `autoinit` class or instance, in definition order,
    inherited fields first (`CLASS_VAR` fields too: their `kind` says so).

    ```python
    import treeclass as tc

    class Tree(tc.TreeClass):
        a: int
        b: float = 2.0

    assert [f.name for f in tc.fields(Tree)] == ["a", "b"]
    ```
    """
    cls = item if isinstance(item, type) else type(item)
    cached = _cached_fields(cls)
    return tuple((collect_fields(cls) if cached is None else cached).values())


def add_field_note(error: BaseException, obj: object, name: str) -> None:
    """Make the error of a failing `on_setattr` callback name the field: in its message
    when that is its one string argument (only `args` change), else in a PEP 678 note."""
    where = f"while setting field `{type_name(obj)}.{name}` (its on_setattr)"
    args = error.args
    try:
        renders_args = not args or (
            len(args) == 1 and isinstance(args[0], str) and str(error) == args[0]
        )
    except Exception:  # a broken __str__: leave the message alone
        renders_args = False
    if renders_args:
        message = f"{where}: {args[0]}" if args else where
        if args and args[0].startswith(where):
            return  # one exception object raised twice (a module-level constant, say)
        error.args = (message,)
        if str(error) == message:
            return
        error.args = args
    add_leaf_note(error, where)


def run_setters(
    obj: object, name: str, callbacks: Iterable[Callable[[Any], Any]], value: Any
) -> Any:
    """`value` through the `on_setattr` callbacks of `obj`'s field `name`; errors name it."""
    try:
        for callback in callbacks:
            value = callback(value)
    except Exception as error:
        add_field_note(error, obj, name)
        raise
    return value


def declare_plain_fields(cls: type) -> dict[str, Field]:
    """The fields `autoinit` gives a plain class, kept on it: its own annotations, its
    `autoinit` bases' fields and its undecorated bases' `field()`s (not their bare
    annotations); its body's Fields stay descriptors, now knowing their annotations."""
    items: dict[str, Field] = {}
    for name, item in collect_fields(cls).items():
        # the nearest class that declares `name` is the one whose declaration counts
        owner = next(
            base
            for base in cls.__mro__
            if name in _own_annotations(base) or name in (_cached_fields(base) or ())
        )
        if (
            owner is cls
            or _cached_fields(owner) is not None
            or isinstance(owner.__dict__.get(name), Field)
        ):
            items[name] = item
    setattr(cls, _PLAIN_FIELDS_ATTR, items)
    for name, item in items.items():
        if not isinstance(cls.__dict__.get(name), Field):
            continue
        if item.kind != "CLASS_VAR":
            setattr(cls, name, item)  # the same Field, now knowing its annotation
        elif item.default is MISSING:  # a class attribute: its default, or nothing
            delattr(cls, name)
        else:
            setattr(cls, name, item.default)
    return items
