"""`autoinit` and the plan of a generated `__init__`: from a class's fields, its signature,
what each field is set to and how a TreeClass instance is sealed, handed to
`_codegen.render_init` as plain data and compiled once per class."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from typing_extensions import dataclass_transform

from . import _node
from ._codegen import InitStore, compile_function, render_init
from ._fields import (
    KINDS,
    MISSING,
    Field,
    add_field_note,
    check_name,
    declare_plain_fields,
    field,
    register_excluded_type,
)
from ._structure import describe
from ._values import PLAIN_TYPES

_DUPLICATE_PARAM_MSG = (
    "{cls}: fields {first!r} and {second!r} both use the `__init__` parameter name {arg!r}. "
    "Give one of them a different `alias`."
)
_REINIT_MSG = (
    "Cannot call `__init__` again on an immutable `{cls}` instance: it would change the "
    "instance in place. Make a new instance instead:\n"
    "    before: tree.__init__(...)\n"
    "    after:  tree = {cls}(...)"
)


def _refuse_reinit(obj: object) -> None:
    raise AttributeError(_REINIT_MSG.format(cls=type(obj).__name__))


def _init_params(cls: type, instance_fields: list[Field]) -> list[Field]:
    """The fields that are `__init__` parameters, in signature order, checked."""
    params = sorted((f for f in instance_fields if f.init), key=lambda f: KINDS.index(f.kind))
    seen_default: Field | None = None
    seen_kinds: set[str] = set()
    owners: dict[str, str] = {}
    for item in params:
        if item.kind in ("VAR_POS", "VAR_KW") and item.kind in seen_kinds:
            raise TypeError(f"{cls.__name__}: only one field may have kind={item.kind!r}.")
        seen_kinds.add(item.kind)
        positional = item.kind in ("POS_ONLY", "POS_OR_KW")
        if positional and item.has_default:
            seen_default = item
        elif positional and seen_default is not None:
            raise TypeError(
                f"{cls.__name__}: field {item.name!r} has no default but follows field "
                f"{seen_default.name!r}, which has one. Give {item.name!r} a default, move it "
                f"before {seen_default.name!r}, or make it kind='KW_ONLY'."
            )
        arg = item.alias or item.name
        if item.alias is not None:
            check_name(cls, item.alias, treeclass=True, what="alias")
        if arg in owners:
            raise TypeError(
                _DUPLICATE_PARAM_MSG.format(
                    cls=cls.__name__, first=owners[arg], second=item.name, arg=arg
                )
            )
        owners[arg] = item.name
    return params


def _bind(namespace: dict[str, Any], what: str, name: str, value: object) -> str:
    """The name under which the generated code reads `value` (put into `namespace`)."""
    namespace[f"__tc_{what}_{name}"] = value
    return f"__tc_{what}_{name}"


def _init_signature(params: list[Field], namespace: dict[str, Any]) -> list[str]:
    """The parameter list of the generated `__init__` (defaults go into `namespace`)."""
    signature: list[str] = []
    for item in params:
        arg = item.alias or item.name
        if item.kind in ("VAR_POS", "VAR_KW"):
            signature.append(("*" if item.kind == "VAR_POS" else "**") + arg)
            continue
        if item.kind == "KW_ONLY" and not any(t.startswith("*") for t in signature):
            signature.append("*")
        if item.default is not MISSING:
            arg += "=" + _bind(namespace, "default", item.name, item.default)
        elif item.factory is not None:
            arg += "=__tc_missing"
        signature.append(arg)
    positional_only = sum(p.kind == "POS_ONLY" for p in params)  # first: params are sorted
    if positional_only:
        signature.insert(positional_only, "/")
    return signature


def _init_stores(
    instance_fields: list[Field], namespace: dict[str, Any], *, through_setattr: bool
) -> list[InitStore]:
    """What the generated `__init__` stores, field by field, in definition order."""
    stores: list[InitStore] = []
    for item in instance_fields:
        arg = item.alias or item.name
        factory = (
            None if item.factory is None else _bind(namespace, "factory", item.name, item.factory)
        )
        if item.init:
            value = arg
            if factory is not None:
                value = f"({factory}() if {arg} is __tc_missing else {arg})"
            if item.kind == "VAR_KW":
                value = f"__tc_dict_type({arg})"
        elif item.default is not MISSING:
            value = _bind(namespace, "default", item.name, item.default)
        elif factory is not None:
            value = f"{factory}()"
        else:
            continue
        if not through_setattr:  # TreeClass: callbacks inline, then a direct store
            for i, fn in enumerate(item.on_setattr):
                value = f"{_bind(namespace, 'set', f'{item.name}_{i}', fn)}({value})"
        stores.append(InitStore(item.name, value, bool(item.on_setattr) and not through_setattr))
    return stores


def _init_sealing(
    cls: type, stores: list[InitStore], has_post_init: bool, namespace: dict[str, Any]
) -> tuple[str, list[str], list[str]]:
    """How a TreeClass `__init__` seals its instance: `(mode, leaf names, static names)`;
    without `__post_init__` its layout (or shape, with static fields) is known now."""
    info = _node.own_info(cls)
    assert info is not None, "a TreeClass gets its record before its __init__ is built"
    namespace.update(
        __tc_cls=cls,
        __tc_seal=_node.seal,
        __tc_seal_after_error=_node.seal_after_error,
        __tc_refuse=_refuse_reinit,
        __tc_set_layout=_node.set_layout,
        __tc_set_flat=_node.set_flat,
    )
    if has_post_init:
        return "dynamic", [], []
    names = tuple(store.name for store in stores)
    shape = info.fix_shape(names)
    if any(name in info.static_names for name in names):
        namespace.update(__tc_shape=shape, __tc_plain=PLAIN_TYPES)
        statics = list(shape.static_names)
        return "shape", [name for name in names if name not in statics], statics
    namespace["__tc_layout"] = shape.layout
    return "fixed", list(names), []


def build_init(cls: type, items: Mapping[str, Field], *, through_setattr: bool) -> Callable:
    """Compile an `__init__` for `cls` from its fields: values stored straight, then sealed
    (TreeClass), or, `through_setattr`, through `setattr` (plain `autoinit` classes)."""
    instance_fields = [f for f in items.values() if f.kind != "CLASS_VAR"]
    params = _init_params(cls, instance_fields)
    namespace: dict[str, Any] = {
        "__tc_missing": MISSING,
        "__tc_dict_type": dict,
        "__tc_note": add_field_note,
    }
    signature = _init_signature(params, namespace)
    stores = _init_stores(instance_fields, namespace, through_setattr=through_setattr)
    has_post_init = getattr(cls, "__post_init__", None) is not None
    sealing, leaves, statics = "none", list[str](), list[str]()
    if not through_setattr:
        sealing, leaves, statics = _init_sealing(cls, stores, has_post_init, namespace)
    source = render_init(
        this="self",
        signature=signature,
        stores=stores,
        post_init=has_post_init,
        sealing=sealing,
        fixed_leaves=leaves,
        static_names=statics,
    )
    label = f"__init__ of {cls.__module__}.{cls.__qualname__}"
    init = compile_function(source, "__init__", namespace, label)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = {
        **{(p.alias or p.name): p.type for p in params if p.type is not None},
        "return": None,
    }
    init.__tc_generated__ = True
    return init


# eq_default=False: no `__eq__` is written (else checkers take a plain class to be unhashable)
@dataclass_transform(field_specifiers=(field, Field), eq_default=False)
def autoinit(cls: type) -> type:
    """Give `cls` an `__init__` generated from its annotated fields, and return `cls`.

    On a `TreeClass` subclass that inherits an `__init__` written by hand, this opts the
    class in to a generated one, from all its fields (getting started, "Writing `__init__`
    by hand"); an `__init__` written in the class body is never replaced (it is
    idempotent). On a plain class values are assigned with `setattr`, so the `on_setattr`
    callbacks of `field()`s run, and a plain subclass inherits the `__init__` and them.

    ```python
    import treeclass as tc

    @tc.autoinit
    class Point:
        x: float = tc.field(on_setattr=[float])
        y: float = 0.0

    assert Point(1).x == 1.0 and Point(1.0).y == 0.0
    ```
    """
    if not isinstance(cls, type):
        raise TypeError(f"`autoinit` expects a class, got {describe(cls)}.")
    info = _node.own_info(cls)
    is_treeclass = info is not None
    own = cls.__dict__.get("__init__")
    if own is not None and (
        not is_treeclass
        or getattr(own, "__tc_generated__", False)
        or getattr(own, "__tc_body__", False)
    ):
        return cls  # generated already, or written in the class body: either way it stays
    items = info.fields if info is not None else declare_plain_fields(cls)
    type.__setattr__(cls, "__init__", build_init(cls, items, through_setattr=not is_treeclass))
    return cls


autoinit.register_excluded_type = register_excluded_type  # type: ignore[attr-defined]
