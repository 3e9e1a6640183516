"""Teaching the printers a type: `register_printer` writes the display part of its row
(found along the MRO, over the kind's own), `printer_alias` PyTreeClass's `def_*` spellings;
every printer opens a node with `view_of` (its display, then the row of its kind).
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import operator
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._structure import (
    LEAF,
    Display,
    NodeKind,
    describe,
    inherited,
    jax_children,
    node_kind,
    node_type,
    registered_kind,
    write_part,
)
from ._util import add_leaf_note
from ._values import short_repr

PrintRule = Display  # the public name of a row's display part
_FIELDS = tuple(f.name for f in dataclasses.fields(Display))

_NOT_A_TYPE_MSG = "`{name}` expects a class as its first argument, got {value}."
_NOT_CALLABLE_MSG = "`register_printer(..., {name}=...)` expects a callable or None, got {value}."
_RULE_RESULT_MSG = (
    "The `{field}` printer rule for `{cls}` ({spelling}) returned {result} for a `{value}`"
    "{problem}; it must return {expected}."
)
_RULE_NOTE = "raised by the `{field}` printer rule for `{cls}` ({spelling})"
# field -> its PyTreeClass spelling, what it sets, what `func` returns, an example's return
_ALIASES = {
    "type_name": ("tree_summary.def_type", "summary Type column text", "str", '"token"'),
    "count": ("tree_summary.def_count", "summary element count", "int", "7"),
    "size": ("tree_summary.def_size", "summary size in bytes", "int", "1024"),
    "nodestyle": ("tree_graph.def_nodestyle", "graphviz node style", "dict", '{"shape": "box"}'),
}
_EXPECTED = {
    "repr": "a `str`",
    "str": "a `str`",
    "type_name": "a `str`",
    "count": "a non-negative `int`",
    "size": "a non-negative `int` (bytes)",
    "nodestyle": (
        "a dict of graphviz attributes: names like 'shape' or 'fillcolor' (letters, digits "
        "and '_', not starting with a digit, not a DOT keyword), values `str`, `int`, "
        "`float` or `bool`"
    ),
    "children": "an iterable of `(key, child)` pairs (keys: `jax.tree_util` key entries)",
}
_DOT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOT_KEYWORDS = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})

_lock = threading.RLock()  # reentrant: `printer_alias` updates a rule under it


def _spelling(cls: type, field: str) -> str:
    text = f"`tc.register_printer({cls.__name__}, {field}=...)`"
    alias = _ALIASES.get(field)
    return text if alias is None else f"{text} or `tc.{alias[0]}({cls.__name__})`"


def _checked_result(cls: type, field: str, value: object, result: Any) -> Any:
    """`result` of the `field` rule if it is what the printers need, else a clear error."""

    def fail(problem: str = "", error: type[Exception] = TypeError) -> Exception:
        return error(
            _RULE_RESULT_MSG.format(
                field=field,
                cls=cls.__name__,
                spelling=_spelling(cls, field),
                result=describe(result),
                value=type(value).__name__,
                expected=_EXPECTED[field],
                problem=problem,
            )
        )

    if field in ("repr", "str", "type_name"):
        if isinstance(result, builtins.str):
            return builtins.str(result)
        raise fail()
    if field in ("count", "size"):
        if isinstance(result, bool):
            raise fail()
        try:
            number = operator.index(result)  # ints and NumPy integers, not floats
        except TypeError:
            raise fail() from None
        if number < 0:
            raise fail(error=ValueError)
        return number
    if field == "children":
        try:
            pairs = list(result)
        except TypeError:
            raise fail() from None
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise fail(f": the item {short_repr(pair, 60)} is not a `(key, child)` pair")
        return pairs
    # nodestyle: names are written into DOT as they are, values quoted by `tree_graph`
    if not isinstance(result, Mapping):
        raise fail()
    for name, item in result.items():  # checked before a name is hashed: it may not be
        if not isinstance(name, builtins.str):
            raise fail(f": the attribute name is {describe(name)}")
        if not _DOT_NAME.match(name) or name.lower() in _DOT_KEYWORDS:
            raise fail(
                f": the attribute name {name!r} is not a graphviz attribute name", ValueError
            )
        if not isinstance(item, (builtins.str, int, float)):  # bool is an int
            raise fail(f": the value of {name!r} is {describe(item)}")
    return dict(result)


def _checking(cls: type, field: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fn` as the printers call it: its result checked, its errors naming the rule."""

    def rule(value: object) -> Any:
        try:
            result = fn(value)
        except Exception as error:
            note = _RULE_NOTE.format(field=field, cls=cls.__name__, spelling=_spelling(cls, field))
            add_leaf_note(error, note)
            raise
        return _checked_result(cls, field, value, result)

    rule.__wrapped__ = fn  # type: ignore[attr-defined]
    return rule


def register_printer(
    cls: type,
    *,
    repr: Callable[[Any], str] | None = None,
    str: Callable[[Any], str] | None = None,
    type_name: Callable[[Any], str] | None = None,
    count: Callable[[Any], int] | None = None,
    size: Callable[[Any], int] | None = None,
    nodestyle: Callable[[Any], dict[str, Any]] | None = None,
    children: Callable[[Any], Iterable[tuple[Any, Any]]] | None = None,
) -> None:
    """Teach every tree printer how to show values of type `cls` (and its subclasses).

    **Arguments**

    - `cls`: the class. Registering it again replaces its rule; with every argument `None`,
      removes it.
    - `repr`: `value -> str`, the text of every printer but `tree_str`; a value with a
      `repr` or `str` prints as a leaf, even a pytree node.
    - `str`: `value -> str`, the text of `tree_str` (defaults to `repr`).
    - `type_name`, `count`, `size`: `value -> str` / `int` / `int` (bytes), the summary's
      Type, Count and Size (defaults: the class name, 0 for objects that are neither
      arrays nor numbers, `sys.getsizeof`); with one (and no `children`), one summary row.
    - `nodestyle`: `value -> dict`, graphviz attributes of the value's node in
      `tree_graph` (`{"shape": "circle"}`): names are graphviz's (letters, digits, `_`),
      values `str`, `int`, `float` or `bool`.
    - `children`: `value -> iterable of (key, child)`, the children the printers show in
      place of JAX's (keys are `jax.tree_util` key entries); with it, `type_name` also
      names the node in `tree_repr` and the pictures.

    **Returns**

    `None`.

    **Raises**

    When a printer calls a function: `TypeError` for a result of the wrong type
    (`ValueError` for a negative number or a bad graphviz name), naming the rule; an
    error raised inside one gets a note naming the rule.

    ```python
    import treeclass as tc

    class Tokenizer:
        def __init__(self, vocab):
            self.vocab = vocab

    tc.register_printer(Tokenizer, repr=lambda t: f"Tokenizer(|V|={len(t.vocab)})",
                        count=lambda t: len(t.vocab))
    assert tc.tree_repr({"tok": Tokenizer("abc")}) == "{'tok': Tokenizer(|V|=3)}"
    tc.register_printer(Tokenizer)  # forget the rule again
    ```
    """
    if not isinstance(cls, type):
        raise TypeError(_NOT_A_TYPE_MSG.format(name="register_printer", value=describe(cls)))
    given = dict(zip(_FIELDS, (repr, str, type_name, count, size, nodestyle, children)))
    for name, value in given.items():
        if value is not None and not callable(value):
            raise TypeError(_NOT_CALLABLE_MSG.format(name=name, value=describe(value)))
    checked = {name: _checking(cls, name, fn) for name, fn in given.items() if fn is not None}
    with _lock:
        own = getattr(type(registered_kind(cls)), "display", None)  # the kind's own display
        rule = dataclasses.replace(own or Display(), **checked) if checked else None
        write_part(cls, "display", rule)


_ALIAS_DOC = """Set the {what} of values of type `cls` (and its subclasses) for `tc.{printer}`:
`tc.register_printer(cls, {field}=func)` keeping the rule's other fields (PyTreeClass).

**Arguments**

- `cls`: the class.
- `func`: `value -> {returns}`; `None` removes this part of the rule.

**Returns**

`func`, or (without `func`) a decorator that registers the function it decorates.

```python
import treeclass as tc

class Token:
    pass

@{name}(Token)
def _(token):
    return {example}

print(tc.{printer}([Token()]))
{name}(Token, None)  # forget it again
```
"""

_DECORATE = object()  # `def_type(T)` without a function: return a decorator


def printer_alias(field: str) -> Callable[..., Any]:
    """A PyTreeClass-style `def_*` function that sets one field of a type's rule."""

    def define(cls: type, func: object = _DECORATE, /) -> Any:
        if not isinstance(cls, type):
            raise TypeError(_NOT_A_TYPE_MSG.format(name=name, value=describe(cls)))
        if func is _DECORATE:
            return lambda func: define(cls, func)
        with _lock:  # the fields registered for exactly `cls`, as they were given
            rule = vars(registered_kind(cls) or NodeKind()).get("display") or Display()
            current = {
                f: getattr(fn, "__wrapped__", fn) for f in _FIELDS if (fn := getattr(rule, f))
            }
            current[field] = func
            register_printer(cls, **current)
        return func

    name, what, returns, example = _ALIASES[field]
    printer, _, define.__name__ = name.rpartition(".")
    define.__qualname__ = define.__name__
    define.__doc__ = _ALIAS_DOC.format(
        what=what, printer=printer, field=field, name=f"tc.{name}", returns=returns, example=example
    )
    return define


def rule_for(value: object) -> PrintRule | None:
    """The display of `type(value)` or its nearest base class, if any: the fields given to
    `register_printer` wrapped to check what they return (a wrong result, or an error
    raised inside one, names the rule), over the kind's own display."""
    return inherited(type(value), "display")


@functools.lru_cache(maxsize=256)  # one row per display
def _display_row(rule: PrintRule) -> NodeKind:
    """A node shown through a display's `children` (and `type_name`)."""
    row: NodeKind = NodeKind()
    row.display = rule
    return row


def view_of(value: object, is_leaf: Callable[[Any], bool] | None = None) -> NodeKind | None:
    """The row that shows `value` (`None`: a leaf, as are the values `is_leaf` stops at and
    those whose display gives a text): its kind's, or one shown through its display."""
    kind = node_kind(value, is_leaf)
    if kind is LEAF:
        return None
    rule = rule_for(value)
    if rule is not None and rule.has_text:
        return None
    row = node_type(value, kind)
    if rule is None or rule.children is None or getattr(type(row), "display", None) is rule:
        return row
    return _display_row(rule)


def children_of(value: object) -> list[tuple[Any, Any]] | None:
    """`value`'s `(key entry, child)` pairs as JAX flattens it, or as its display shows them."""
    rule = rule_for(value)
    if rule is not None and rule.children is not None and not rule.has_text:
        return list(rule.children(value))
    return jax_children(value)
