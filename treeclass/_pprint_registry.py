"""Teaching the printers a new type: `register_printer`.

One rule per type tells every printer (`tree_repr`, `tree_str`, `tree_diagram`,
`tree_summary`, `tree_graph`, `tree_mermaid` and the notebook display) how to show a value
of that type: its text, the name in the summary's Type column, its element count and its
size in bytes. Rules are found along the value's method resolution order, so a rule for a
base class also covers its subclasses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["register_printer", "PrintRule"]


class PrintRule(NamedTuple):
    """How the printers show values of one type; a field left as `None` keeps the default.

    `register_printer` builds one from its keyword arguments; the fields are the same
    callables (`repr`, `str`, `type_name`, `count`, `size`).

    ```python
    import treeclass as tc

    rule = tc.PrintRule(repr=lambda v: "<secret>")
    assert rule.repr(object()) == "<secret>" and rule.count is None
    ```
    """

    repr: Callable[[Any], str] | None = None
    str: Callable[[Any], str] | None = None
    type_name: Callable[[Any], str] | None = None
    count: Callable[[Any], int] | None = None
    size: Callable[[Any], int] | None = None


_NOT_A_TYPE_MSG = "`register_printer` expects a class as its first argument, got {value!r}."
_NOT_CALLABLE_MSG = "`register_printer(..., {name}=...)` expects a callable or None, got {value!r}."

# The rules are process-wide by nature (a user teaches the printers a type once). Writers
# take the lock and publish fresh dicts, so readers never see a half-updated table and
# need no lock: swapping a module attribute is atomic.
_lock = threading.Lock()
_rules: dict[type, PrintRule] = {}
_resolved: dict[type, PrintRule | None] = {}  # per concrete type, including misses


def register_printer(
    cls: type,
    *,
    repr: Callable[[Any], str] | None = None,
    str: Callable[[Any], str] | None = None,
    type_name: Callable[[Any], str] | None = None,
    count: Callable[[Any], int] | None = None,
    size: Callable[[Any], int] | None = None,
) -> None:
    """Teach every tree printer how to show values of type `cls` (and its subclasses).

    **Arguments**

    - `cls`: the class to register. Registering it again replaces its rule; registering it
      with every argument `None` removes the rule.
    - `repr`: `value -> str`, the compact text used by `tree_repr`, `tree_diagram`,
      `tree_graph`, `tree_mermaid` and the notebook display.
    - `str`: `value -> str`, the text used by `tree_str` (defaults to `repr`).
    - `type_name`: `value -> str`, the summary's Type column (defaults to the class name).
    - `count`: `value -> int`, the summary's Count column (defaults to 0 for objects
      that are neither arrays nor numbers).
    - `size`: `value -> int`, bytes for the summary's Size column (defaults to
      `sys.getsizeof`).

    A value with a rule is always printed as a leaf, even if it is a pytree node.

    **Returns**

    `None`.

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
    global _rules, _resolved
    if not isinstance(cls, type):
        raise TypeError(_NOT_A_TYPE_MSG.format(value=cls))
    rule = PrintRule(repr=repr, str=str, type_name=type_name, count=count, size=size)
    for name, value in zip(PrintRule._fields, rule, strict=True):
        if value is not None and not callable(value):
            raise TypeError(_NOT_CALLABLE_MSG.format(name=name, value=value))
    with _lock:
        rules = dict(_rules)
        if any(value is not None for value in rule):
            rules[cls] = rule
        else:
            rules.pop(cls, None)
        _rules = rules
        _resolved = {}


def rule_for(value: Any) -> PrintRule | None:
    """The rule registered for `type(value)` or its nearest base class, if any."""
    if not _rules:  # the common case: nothing registered, no lookup at all
        return None
    kind = type(value)
    resolved = _resolved
    try:
        return resolved[kind]
    except KeyError:
        pass
    rules = _rules
    found = next((rules[base] for base in kind.__mro__ if base in rules), None)
    resolved[kind] = found
    return found
