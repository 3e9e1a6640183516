"""All code treeclass generates, the `__init__` of a class and the unflatten of a layout
(hot paths, where code specialised to one class beats a loop by about 2x), compiled under
a filename that says what it is, with its source in `linecache` for tracebacks.
"""

from __future__ import annotations

import itertools
import linecache
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

_serial = itertools.count(1)


def compile_function(source: str, name: str, namespace: dict[str, Any], label: str) -> Any:
    """Compile `source`, defining `name`, with `namespace` as globals, in the file
    `<treeclass {label}>` (for tracebacks)."""
    filename = f"<treeclass {label}>"
    cached: Any = linecache.cache.get(filename)  # (size, mtime, lines, name) for ours
    if cached is not None and "".join(cached[2]) != source:
        # another function under this label (a class redefined in a notebook): keep both
        filename = f"<treeclass {label} #{next(_serial)}>"
    exec(compile(source, filename, "exec"), namespace)
    function = namespace[name]
    lines = source.splitlines(keepends=True)
    # mtime None: `linecache.checkcache` leaves the entry alone (there is no file)
    linecache.cache[filename] = (len(source), None, lines, filename)
    weakref.finalize(function, _forget, filename, lines)
    return function


def _forget(filename: str, lines: list[str]) -> None:
    cached: Any = linecache.cache.get(filename)
    if cached is not None and cached[2] is lines:
        del linecache.cache[filename]


def _indent(lines: Sequence[str], levels: int = 1) -> list[str]:
    pad = "    " * levels
    return [pad + line if line else line for line in lines]


class InitStore(NamedTuple):
    """One field set by a generated `__init__`: `name` gets the value of `expr`."""

    name: str
    expr: str
    noted: bool  # wrap in a try that names the field when its `on_setattr` raises


def _store_lines(this: str, store: InitStore, through_setattr: bool) -> list[str]:
    if through_setattr:
        return [f"{this}.{store.name} = {store.expr}"]
    # the value also goes into a local, which the sealing below reads instead of the dict
    line = f"__tc_state[{store.name!r}] = __tc_f_{store.name} = {store.expr}"
    if not store.noted:
        return [line]
    # a try block costs nothing in CPython 3.11+ until it raises
    return [
        "try:",
        f"    {line}",
        "except Exception as __tc_error:",
        f"    __tc_note(__tc_error, {this}, {store.name!r})",
        "    raise",
    ]


def render_init(
    *,
    this: str,
    signature: Sequence[str],
    stores: Sequence[InitStore],
    post_init: bool,
    sealing: str,
    fixed_leaves: Sequence[str] = (),
    static_names: Sequence[str] = (),
) -> str:
    """The source of a generated `__init__`. `sealing`: `"none"` (a plain `autoinit`
    class: `setattr`), `"dynamic"` (the layout computed at the end: `__post_init__` may
    change the names), `"fixed"` (the class's one layout written into the slots) or
    `"shape"` (the values of `static_names` pick the layout; `fixed_leaves`: the children)."""
    body: list[str] = []
    for store in stores:
        body += _store_lines(this, store, through_setattr=sealing == "none")
    if post_init:
        body.append(f"{this}.__post_init__()")
    head = f"def __init__({', '.join([this, *signature])}):"
    if sealing == "none":
        return "\n".join([head, *_indent(body or ["pass"])]) + "\n"
    children = "".join(f"__tc_f_{name}, " for name in fixed_leaves)
    if sealing == "fixed":
        seal = [
            f"__tc_set_layout({this}, __tc_layout)",
            f"__tc_set_flat({this}, (({children}), __tc_layout))",
        ]
    elif sealing == "shape":
        seal = _shape_lookup(this, static_names, children)
    else:
        seal = [f"__tc_seal({this})"]
    lines = [
        head,
        # a fresh instance has no attributes yet; anything else may be a sealed instance
        # whose __init__ is called again, which must not change it
        f"    __tc_state = {this}._tc_dict",
        f"    if __tc_state and {this}._tc_layout is not None:",
        f"        __tc_refuse({this})",
        "    try:",
        *_indent(body, 2),
        # sealing inside the try: it can fail (an unhashable static value), and the
        # instance, maybe stored somewhere already, must not stay mutable
        f"        if type({this}) is __tc_cls:",
        *_indent(seal, 3),
        "    except BaseException:",
        f"        if type({this}) is __tc_cls:",
        f"            __tc_seal_after_error({this})",
        "        raise",
    ]
    return "\n".join(lines) + "\n"


def _shape_lookup(this: str, static_names: Sequence[str], children: str) -> list[str]:
    """Seal an instance with static values: plain ones leave its layout pending, others
    are keyed now (so an unhashable one fails in `__init__`, naming its field)."""
    values = [f"__tc_f_{name}" for name in static_names]
    plain = " and ".join(f"type({v}) in __tc_plain" for v in values)
    given = "".join(f"{v}, " for v in values)
    return [
        f"if {plain}:",
        f"    __tc_set_layout({this}, __tc_shape)",
        "else:",
        f"    __tc_layout = __tc_shape.with_values(({given}))",
        f"    __tc_set_layout({this}, __tc_layout)",
        f"    __tc_set_flat({this}, (({children}), __tc_layout))",
    ]


def render_build(names: Sequence[str], leaf_names: Sequence[str], *, inline_fixed: bool) -> str:
    """The source of `build(layout, children)`, the unflatten of every layout with these
    attribute names (statics read from `layout.values`). With `inline_fixed` it serves a
    whole class, handing another layout to its own `build`. Stores go one by one: measured
    faster than building a dict and setting it."""
    leaf_index = {name: i for i, name in enumerate(leaf_names)}
    values: list[str] = []
    static_index = 0
    for name in names:
        if name in leaf_index:
            values.append(f"c{leaf_index[name]}")
        else:
            values.append(f"values[{static_index}]")
            static_index += 1
    body: list[str] = []
    if inline_fixed and static_index:
        body += ["if layout.shape is not shape:", "    return layout.build(layout, children)"]
    elif inline_fixed:  # the class's one layout: an identity check, no attribute read
        body += ["if layout is not fixed:", "    return layout.build(layout, children)"]
    body += [
        "tree = new(cls)",
        "set_layout(tree, layout)",
        "set_flat(tree, (children, layout))",
        "state = tree._tc_dict",
    ]
    if leaf_names:
        targets = "".join(f"c{i}, " for i in range(len(leaf_names)))
        body.append(f"{targets}= children")
    if static_index:
        body.append("values = layout.values")
    body += [f"state[{name!r}] = {value}" for name, value in zip(names, values)]
    body.append("return tree")
    return "\n".join(["def build(layout, children):", *_indent(body)]) + "\n"
