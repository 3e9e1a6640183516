"""Notebook display of trees: rich HTML (`tree_html`) and treescope (`treescope_repr`).

`TreeClass` plugs these in as `_repr_html_` and `__treescope_repr__`. Treescope is never
imported here: it calls `__treescope_repr__` only once it is itself imported, so
`treescope_repr` imports it lazily at that point.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

from ._pprint import _Entry, _picture_entries

__all__ = ["tree_html", "treescope_repr"]

# Inline styles: notebook front ends strip <style> blocks inconsistently.
_ROOT_STYLE = "font-family: monospace; white-space: pre; line-height: 1.4"
_CHILDREN_STYLE = "margin-left: 1.5em; border-left: 1px solid #ccc; padding-left: 0.5em"


def _html_lines(entry: _Entry, level: int, open_levels: int, out: list[str]) -> None:
    label = html.escape(entry.label)
    if not entry.children:
        out.append(f"<div>{label}</div>")
        return
    state = ' open="open"' if level < open_levels else ""
    out.append(f"<details{state}><summary>{label}</summary><div style=\"{_CHILDREN_STYLE}\">")
    for child in entry.children:
        _html_lines(child, level + 1, open_levels, out)
    out.append("</div></details>")


def tree_html(
    tree: Any,
    *,
    depth: float = math.inf,
    is_leaf: Callable[[Any], bool] | None = None,
    open_levels: int = 1,
) -> str:
    """The tree as HTML with collapsible nodes (what Jupyter shows for a `TreeClass`).

    Each node is a `<details>` element labelled like a line of `tree_diagram`
    (`.b:tuple`); leaves show `key=value`.

    **Arguments**

    - `tree`: any pytree.
    - `depth`, `is_leaf`: as for `tree_diagram`.
    - `open_levels`: how many levels start expanded (the root only, by default).

    **Returns**

    An HTML fragment, a `str` (also well-formed XML).

    ```python
    from treeclass._pprint_html import tree_html

    page = tree_html({"a": 1, "b": [2.0]})
    assert "<summary>[&#x27;b&#x27;]:list</summary>" in page
    ```
    """
    root = _picture_entries(tree, depth, is_leaf)
    out = [f'<div class="treeclass-tree" style="{_ROOT_STYLE}">']
    _html_lines(root, 0, open_levels, out)
    out.append("</div>")
    return "\n".join(out)


def treescope_repr(tree: Any, path: str | None, subtree_renderer: Any) -> Any:
    """Render a `TreeClass` for treescope as `Name(field=..., ...)` with foldable fields.

    Fields declared with `repr=False` are hidden, as in `tree_repr`.

    **Arguments**

    - `tree`: a `TreeClass` instance.
    - `path`, `subtree_renderer`: as passed by treescope to `__treescope_repr__`.

    **Returns**

    A treescope rendering.

    ```python
    import treescope
    import treeclass as tc

    class Tree(tc.TreeClass):
        a: int = 1

    assert "a=1" in treescope.render_to_text(Tree())
    ```
    """
    from treescope import repr_lib  # treescope is already imported when it calls us

    fields = getattr(type(tree), "_tc_fields", {})
    attributes = {
        name: value
        for name, value in tree.__dict__.items()
        if name not in fields or fields[name].repr
    }
    return repr_lib.render_object_constructor(
        object_type=type(tree),
        attributes=attributes,
        path=path,
        subtree_renderer=subtree_renderer,
        roundtrippable=False,
    )
