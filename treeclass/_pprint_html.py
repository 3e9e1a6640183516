"""Notebook display: HTML (`tree_html`) and treescope (`treescope_repr`, imported to render),
`Printed`'s `_repr_html_` and `__treescope_repr__`. The HTML is `<details>` with inline
styles: it folds without JavaScript, survives a stripped `<style>`, takes the page's colours.
"""

from __future__ import annotations

import html
import math
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._pprint import (
    DEFAULT_REPEATS,
    Entry,
    Run,
    fold_runs,
    is_function,
    leaf_text,
    picture_entries,
    tree_repr,
    tree_str,
)
from ._pprint_registry import rule_for, view_of
from ._structure import row_of, wrapper_of
from ._values import offer_display

if TYPE_CHECKING:  # an optional dependency: imported where a rendering is made
    from treescope.rendering_parts import RenderableTreePart

_OPEN_LINES = 40  # the first view opens as many levels as fit in this many lines

_ROOT_STYLE = "font-family: monospace; white-space: pre; line-height: 1.45; color: inherit"
_SUMMARY_STYLE = "cursor: pointer"
_CHILDREN_STYLE = (  # translucent grey reads on white and on black alike
    "margin-left: 0.45em; padding-left: 1.1em; border-left: 1px solid rgba(128, 128, 128, 0.45)"
)
_RUN_STYLE = "opacity: 0.7"


def _open_levels(root: Entry) -> int:
    """How many levels to open so that at most `_OPEN_LINES` lines show (at least 1)."""
    shown, level, frontier = 1, 0, [root]
    while frontier:
        below = [child for entry in frontier if not entry.run for child in entry.children]
        if level >= 1 and shown + len(below) > _OPEN_LINES:
            break
        shown += len(below)
        level += 1
        frontier = [entry for entry in below if entry.children and not entry.run]
    return max(level, 1)


def _html_lines(entry: Entry, level: int, open_levels: float, out: list[str]) -> None:
    label = html.escape(entry.label)
    if entry.run:
        label = f'<span style="{_RUN_STYLE}">{label}</span>'
    if not entry.children:
        out.append(f"<div>{label}</div>")
        return
    # a folded run opens only on a click: it is folded because it is long
    state = ' open="open"' if level < open_levels and not entry.run else ""
    out.append(
        f'<details{state}><summary style="{_SUMMARY_STYLE}">{label}</summary>'
        f'<div style="{_CHILDREN_STYLE}">'
    )
    for child in entry.children:
        _html_lines(child, level + 1, open_levels, out)
    out.append("</div></details>")


def tree_html(
    tree: object,
    *,
    depth: float = math.inf,
    is_leaf: Callable[[Any], bool] | None = None,
    open_levels: int | None = None,
    repeats: int | None = DEFAULT_REPEATS,
) -> str:
    """The tree as HTML with collapsible nodes (what Jupyter shows for a `TreeClass`),
    labelled as `tree_diagram`'s lines without `repr=False` fields; `open_levels` levels
    start expanded (by default, as many as fit the first view in about 40 lines).

    ```python
    from treeclass._pprint_html import tree_html

    page = tree_html({"a": 1, "b": [2.0]})
    assert '[&#x27;b&#x27;]:list</summary>' in page
    ```
    """
    root = picture_entries(tree, depth, is_leaf, repeats, hidden=False, open_runs=True)
    levels = _open_levels(root) if open_levels is None else open_levels
    out = [f'<div class="treeclass-tree" style="{_ROOT_STYLE}">']
    _html_lines(root, 0, levels, out)
    out.append("</div>")
    return "".join(out)  # no newlines: the root's `white-space: pre` would show them


# `_repr_html_` for instances only: the class's is not callable (treescope would draw a
# class with one twice)
html_display = property(lambda self: types.MethodType(tree_html, self))


# -- treescope ------------------------------------------------------------------------------


def _separator(last: bool) -> Any:
    from treescope import rendering_parts as parts

    if last:  # a trailing comma only when the node is expanded
        return parts.fold_condition(expanded=parts.text(","))
    return parts.siblings(",", parts.fold_condition(collapsed=parts.text(" ")))


def _render_child(
    value: object, path: str | None, subtree_renderer: Callable[..., Any], repeats: int | None
) -> Any:
    from treescope import rendering_parts as parts

    # our text where treescope shows `<object at 0x…>`: a rule's, a wrapped function's
    rule = rule_for(value)
    if (rule and rule.repr) or (is_function(value) and not isinstance(value, types.FunctionType)):
        return parts.build_one_line_tree_node(parts.text(leaf_text(value)), path=path)
    # treescope never folds the dicts, lists and tuples it draws: those with runs are drawn here
    view = view_of(value)
    if repeats is not None and view is not None and not view.named:
        items = view.items(value, False) or []
        folded = fold_runs(items, repeats)
        if len(folded) != len(items):
            return _render_node(folded, path, subtree_renderer, repeats, view.brackets)
    return subtree_renderer(value, path=path)


def _render_node(
    items: list[Any],
    path: str | None,
    subtree_renderer: Callable[..., Any],
    repeats: int | None,
    brackets: tuple[str | RenderableTreePart, str | RenderableTreePart],
    static_labels: frozenset[str] = frozenset(),
) -> Any:
    """A node's `(label, key, child)` items and folded runs, drawn as treescope draws a node."""
    from treescope import rendering_parts as parts

    children = []
    for i, item in enumerate(items):
        last = i == len(items) - 1
        if type(item) is Run:
            line = parts.abbreviation_color(parts.text(item.text))
            children.append(parts.siblings(line, _separator(last)))
            continue
        label, key, child = item
        child_path = None if path is None else path + key
        rendering = _render_child(child, child_path, subtree_renderer, repeats)
        line = [parts.siblings_with_annotations(label, rendering), _separator(last)]
        if label in static_labels:
            line.append(
                parts.fold_condition(expanded=parts.comment_color(parts.text("  # static")))
            )
        children.append(parts.build_full_line_with_annotations(*line))
    return parts.build_foldable_tree_node_from_children(
        prefix=brackets[0], children=children, suffix=brackets[1], path=path
    )


def treescope_repr(
    tree: object,
    path: str | None,
    subtree_renderer: Callable[..., Any],
    *,
    repeats: int | None = DEFAULT_REPEATS,
) -> Any:
    """Render a `TreeClass` (or a node with a `children` print rule) for treescope, as
    `__treescope_repr__(path, subtree_renderer)`: a foldable `Name(field=..., ...)` node,
    static fields commented `# static`, `repr=False` fields hidden, long runs folded.

    ```python
    import treescope
    import treeclass as tc

    class Tree(tc.TreeClass):
        a: int = 1
        name: str = tc.field(default="x", static=True)

    with treescope.using_expansion_strategy(target_width=0):  # expand every node
        assert "name='x',  # static" in treescope.render_to_text(Tree())
    ```
    """
    from treescope import rendering_parts as parts

    row = row_of(tree)
    # a rule's children, else the fields (a rule's text is for the other printers)
    view = view_of(tree) or row
    items = view.items(tree, False) or []
    static_labels = frozenset(f"{name}=" for name in row.static_names(tree))
    # a rule may name the node otherwise (`Stacked[48×Block]`); else its qualified class
    named = view.type_name(tree)
    own = named == type(tree).__name__
    type_name = parts.maybe_qualified_type_name(type(tree)) if own else parts.text(named)
    # in treescope's round-trip mode the text must evaluate: `<...>` marks that it won't
    opening = parts.siblings(parts.roundtrip_condition(roundtrip=parts.text("<")), type_name, "(")
    closing = parts.siblings(")", parts.roundtrip_condition(roundtrip=parts.text(">")))
    return _render_node(items, path, subtree_renderer, repeats, (opening, closing), static_labels)


def wrapper_treescope_repr(
    wrapped: object, path: str | None, subtree_renderer: Callable[..., Any]
) -> Any:
    """Render a wrapper node (a frozen value) for treescope: its mark and the value inside
    (`freeze(...)` in round-trip mode), as the wrapper's row says."""
    from treescope import rendering_parts as parts

    wrapper = wrapper_of(wrapped)
    if wrapper is None:
        raise TypeError(f"not a wrapper node: {type(wrapped).__name__}")
    # the inner value has no path of its own: unwrapping is not an attribute
    inner = _render_child(wrapper.unwrap(wrapped), None, subtree_renderer, DEFAULT_REPEATS)
    marker = parts.roundtrip_condition(
        roundtrip=parts.text(wrapper.maker + "("),
        not_roundtrip=parts.comment_color(parts.text(wrapper.mark)),
    )
    closing = parts.roundtrip_condition(roundtrip=parts.text(")"))
    return parts.build_one_line_tree_node(
        parts.siblings_with_annotations(marker, inner, closing), path=path
    )


# a frozen value (a floor below) shows itself in treescope with this printer
offer_display("treescope", wrapper_treescope_repr)


class Printed:
    """`repr`, `str`, notebook HTML and treescope through the shared printers: the one
    display protocol of `TreeClass`, `Stacked` and `Periodic`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return tree_repr(self)

    def __str__(self) -> str:
        return tree_str(self)

    _repr_html_ = html_display  # a method of instances only

    def __treescope_repr__(self, path: str | None, subtree_renderer: Callable[..., Any]) -> Any:
        return treescope_repr(self, path, subtree_renderer)
