"""`TreeClass`: a class whose instances are registered, immutable JAX pytrees (the storage
is `_node`'s contract, `__init__` generation `_autoinit`'s and `_codegen`'s)."""

from __future__ import annotations

import abc
import functools
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax
from typing_extensions import Self, dataclass_transform

from . import _node
from ._at import AtIndexer
from ._autoinit import build_init
from ._class_keywords import check_class_keywords
from ._fields import MISSING, Field, add_field_note, collect_fields, field, run_setters
from ._pprint_html import Printed
from ._structure import describe
from ._util import is_tree_equal
from ._values import closest

_SETSTATE_MSG = (
    "Cannot call `__setstate__` on an immutable `{cls}` instance: it would replace its "
    "attributes in place. Unpickle or copy it instead (`copy.deepcopy(tree)`)."
)
_SLOTS_MSG = (
    "`{cls}` defines `__slots__` {slots}: TreeClass instances keep their attributes in "
    "`__dict__` (flatten reads them from there), so slots would hide them. Remove "
    "`__slots__` from the class body."
)
_RESERVED_METHOD_MSG = (
    "`{cls}` defines (or inherits from a mixin) `{name}`: TreeClass reserves it, since it "
    "keeps instances immutable after `__init__` (and what JAX flattens equal to what "
    "attribute reads return). To validate or convert values on assignment, use a field "
    "callback instead:\n"
    "    x: float = tc.field(on_setattr=[check])"
)
_DICT_VALUE_MSG = "`__dict__` must be set to a dict, got {value}."
_REPLACE_UNKNOWN_MSG = (
    "`{cls}.replace` got {name!r}, which is not an attribute of this instance.{hint} Its "
    "attributes: {names}."
)


class _AttributesView:
    """`instance.__dict__` (and `vars(instance)`): the attributes, read-only once sealed."""

    __slots__ = ()

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        state = _node.attributes(obj)
        if _node.is_sealed(obj):
            return types.MappingProxyType(state)
        return state

    def __set__(self, obj: object, value: object) -> None:
        if _node.is_sealed(obj):
            _node.refuse_write(obj, "__dict__", "set")
        if not isinstance(value, dict):
            raise TypeError(_DICT_VALUE_MSG.format(value=describe(value)))
        _node.set_attributes(obj, value)

    def __delete__(self, obj: object) -> None:
        _node.refuse_write(obj, "__dict__", "delete")


def _sealing_init(
    init: Callable[..., None], *, body: bool, warning: str | None = None
) -> Callable[..., None]:
    """Wrap a hand-written (or inherited foreign) `__init__` so that the outermost one seals
    on return; `body`: written in the class body (`autoinit` never replaces it); `warning`:
    said at each outermost call."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        outermost = type(self).__init__ is __init__
        if warning is not None and outermost:
            warnings.warn(warning, UserWarning, stacklevel=2)  # the caller's construction
        if not _node.attributes(self):
            # a fresh instance: mark it unsealed, so that each `self.x = ...` in `init`
            # finds the slot set (an unset slot costs a failed lookup per assignment)
            _node.set_layout(self, None)
        try:
            init(self, *args, **kwargs)
            if outermost:
                _node.seal(self)  # inside the try: see `render_init` in _codegen.py
        except BaseException:
            if outermost:
                _node.seal_after_error(self)
            raise

    # markers for `__init_subclass__` and `autoinit` (through `vars`: unknown to type checkers)
    vars(__init__).update(__tc_sealing__=True, __tc_body__=body)
    return __init__


_UNRUN_POST_INIT_MSG = (
    "`{cls}.__post_init__` will not run: `{cls}` has no `__init__` of its own and inherits "
    "the one written by hand in `{owner}`, so no `__init__` is generated for it (only a "
    "generated `__init__` calls `__post_init__`). Generate one from the fields, or call it "
    "yourself:\n"
    "    @tc.autoinit\n"
    "    class {cls}({owner}): ...\n"
    "or define `__init__` in `{cls}` that calls `super().__init__(...)` and then "
    "`self.__post_init__()`."
)


def _guard_fields(cls: type, items: dict[str, Field]) -> None:
    """Put a guard on `cls` for each instance field it declares or gives a new default."""
    own = cls.__dict__.get("__annotations__", {})
    for name, item in items.items():
        current = cls.__dict__.get(name, MISSING)
        if item.kind == "CLASS_VAR":  # a class attribute: its default, or nothing
            if isinstance(current, Field):
                if item.default is MISSING:
                    type.__delattr__(cls, name)
                else:
                    type.__setattr__(cls, name, item.default)
            continue
        if name in own or (current is not MISSING and not isinstance(current, _node.GUARDS)):
            # not annotated here: a plain class attribute overriding an inherited default
            default = item.default if name in own else current
            default = _node.NOTHING if default is MISSING else default
            _node.guard_field(cls, name, default, item.on_getattr)


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
# The metaclass is plain ABCMeta (`abc.abstractmethod` works): construction is the C-level
# `type.__call__`, and `__init__` seals (generated inline, hand-written via `_sealing_init`).
class TreeClass(_node.TreeNode, Printed, metaclass=abc.ABCMeta):
    """Base class for classes whose instances are JAX pytrees.

    Subclassing registers the class with `jax.tree_util`: the children are the instance
    attributes in assignment order, but for `field(static=True)` ones (in the tree
    definition). Annotated fields give an `__init__` unless the class has one written by
    hand; instances are immutable after `__init__` (edit them with `.at[...]`).

    **Class keywords**

    - `leafwise=True`: add leafwise arithmetic and comparison operators (`tc.leafwise`).
    - `version=N`, `migrations={from_version: step}`: the class's checkpoint version
      (0 when not given; inherited) and the steps `tc.load` runs to upgrade older files,
      each a rule table as `rules=` takes or a function of a name -> array mapping (the
      checkpoints reference, "Versions and migrations").

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

    __slots__ = ()
    # a descriptor in place of the `__dict__` slot, which typeshed declares as a mapping
    __dict__ = _AttributesView()  # pyright: ignore[reportGeneralTypeIssues,reportAssignmentType]

    def __init_subclass__(
        cls,
        *,
        leafwise: bool = False,
        version: int | None = None,
        migrations: dict[int, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        slots = cls.__dict__.get("__slots__", ())
        slots = (slots,) if isinstance(slots, str) else tuple(slots)
        if cls.__dictoffset__ == 0 or set(slots) - {"__dict__", "__weakref__"}:
            raise TypeError(_SLOTS_MSG.format(cls=cls.__name__, slots=slots))
        for name in ("__setattr__", "__delattr__"):
            if getattr(cls, name) is not getattr(TreeClass, name):  # in the body or a mixin
                raise TypeError(_RESERVED_METHOD_MSG.format(cls=cls.__name__, name=name))
        items = collect_fields(cls, marked_bases_only=True)
        instance_fields = [f for f in items.values() if f.kind != "CLASS_VAR"]
        _node.attach_info(
            cls,
            items,
            static_names=tuple(f.name for f in instance_fields if f.static),
            setters={f.name: f.on_setattr for f in instance_fields if f.on_setattr},
        )
        _guard_fields(cls, items)
        own_init, inherited = cls.__dict__.get("__init__"), cls.__init__
        if own_init is not None:
            if not getattr(own_init, "__tc_generated__", False):
                type.__setattr__(cls, "__init__", _sealing_init(own_init, body=True))
        # Without an `__init__` of its own, one is generated only below generated ones (or
        # none): one written by hand up the chain stays in charge, the annotated fields are
        # its typed attributes with class-level defaults (`autoinit` opts in to generation).
        elif getattr(inherited, "__tc_generated__", False) or inherited is object.__init__:
            type.__setattr__(cls, "__init__", build_init(cls, items, through_setattr=False))
        elif "__post_init__" in cls.__dict__:  # the inherited `__init__` never calls it
            owner = next(k for k in cls.__mro__[1:] if "__init__" in k.__dict__)
            warning = _UNRUN_POST_INIT_MSG.format(cls=cls.__name__, owner=owner.__name__)
            init = _sealing_init(inherited, body=False, warning=warning)
            type.__setattr__(cls, "__init__", init)
        elif not getattr(inherited, "__tc_sealing__", False):  # a plain mixin's: it must seal
            type.__setattr__(cls, "__init__", _sealing_init(inherited, body=False))
        # class data that the checkpoint package checks and keeps: never on the flatten path
        check_class_keywords(cls, {"version": version, "migrations": migrations})
        _node.register(cls)
        if leafwise:
            from ._leafwise import leafwise as make_leafwise

            make_leafwise(cls)

    # -- immutability ------------------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        if _node.is_sealed(self):
            _node.refuse_write(self, name, "set")
        info = _node.info(self)
        callbacks = info.setters.get(name)
        if callbacks:  # `run_setters`, inlined: a hand-written `__init__` assigns here
            try:
                for callback in callbacks:
                    value = callback(value)
            except Exception as error:
                add_field_note(error, self, name)
                raise
        descriptor = info.setter_kind(name)
        if descriptor is not None:  # a property (with a setter), say: as plain Python does
            descriptor.__set__(self, value)
            return
        _node.attributes(self)[name] = value

    def __delattr__(self, name: str) -> None:
        if _node.is_sealed(self):
            _node.refuse_write(self, name, "delete")
        descriptor = _node.info(self).setter_kind(name)
        if descriptor is not None:
            descriptor.__delete__(self)
            return
        try:
            del _node.attributes(self)[name]
        except KeyError:
            raise AttributeError(
                f"`{type(self).__name__}` instance has no attribute {name!r}"
            ) from None

    # -- the indexer -------------------------------------------------------------------

    @property
    def at(self) -> AtIndexer[Self]:
        """The `.at[...]` indexer: select parts of this tree and get a new tree back."""
        return AtIndexer(self)

    # -- replace -----------------------------------------------------------------------

    def replace(self, /, **changes: object) -> Self:
        """A copy of this instance with the named attributes changed, each through its field's
        `on_setattr` callbacks (`.at[...].set` runs none); static fields may change too.
        Neither `__init__` nor `__post_init__` runs. `copy.replace(tree, ...)` (3.13+) and
        `tc.TreeClass.replace(tree, ...)` reach it where an attribute hides the method.

        **Arguments**

        - `**changes`: new values by attribute name, stored as given: `replace(bias=0.0)`
          stores the float, `.at["bias"].set(0.0)` an array of the leaf's shape and dtype.

        **Returns**

        A new instance of the same class; this one is unchanged.

        **Raises**

        `TypeError` for a name that is not an attribute of the instance (naming the closest
        one); whatever an `on_setattr` callback raises, with a note naming its field.

        ```python
        import treeclass as tc

        class Adam(tc.TreeClass):
            lr: float = tc.field(default=1e-3, on_setattr=[float])
            name: str = tc.field(default="adam", static=True)

        opt = Adam()
        faster = opt.replace(lr=1)                # validated: converted to a float
        assert faster.lr == 1.0 and type(faster.lr) is float and opt.lr == 1e-3
        assert opt.replace(name="adamw").name == "adamw"   # a static field: a new layout
        ```
        """
        attributes = _node.attributes(self)
        info = _node.info(self)
        layout_changes = False
        for name in changes:
            if name not in attributes:
                close = closest(name, attributes)
                raise TypeError(
                    _REPLACE_UNKNOWN_MSG.format(
                        cls=type(self).__name__,
                        name=name,
                        hint="" if close is None else f" Did you mean {close!r}?",
                        names=", ".join(attributes) or "none",
                    )
                )
            callbacks = info.setters.get(name)
            if callbacks:
                changes[name] = run_setters(self, name, callbacks, changes[name])
            if name in info.static_names:
                layout_changes = True
        if not layout_changes:  # the same names and static values: the same layout
            return _node.replace_children(self, changes)
        new = object.__new__(type(self))
        _node.set_attributes(new, {**attributes, **changes})
        if _node.is_sealed(self):
            _node.seal_like(new, self)  # the layout of the new static values (refusing unhashable)
        return new

    __replace__ = replace

    # -- dunders -----------------------------------------------------------------------

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

    def __copy__(self) -> Self:
        return _node.replace_children(self, {})

    def __getstate__(self) -> dict[str, Any]:
        return dict(_node.attributes(self))

    def __setstate__(self, state: dict[str, Any]) -> None:
        if _node.is_sealed(self):  # only fresh unpickled objects
            raise AttributeError(_SETSTATE_MSG.format(cls=type(self).__name__))
        _node.set_attributes(self, dict(state))
        _node.seal(self)
