"""The package's floors hold: imports point down, never in a cycle, never at private names.

Every import of every module is read with `ast`, function-level imports included, so a
"temporary" import inside a function counts as much as one at the top. The floors are
those of docs/architecture.md; a new module must be given one here (and there).
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "treeclass"

# module (relative to the package, a subpackage's modules as `pkg.module`) -> floor
FLOORS = {
    "_values": 0,
    "_numbers": 0,
    "_codegen": 0,
    "_backend": 0,
    "_glob": 0,
    "_class_keywords": 0,
    "_node": 1,
    "_util": 2,
    "_structure": 2,
    "_frozen": 3,
    "_mask": 3,
    "_trace": 3,
    "_leafwise": 3,
    "_fields": 3,
    "_roles": 3,
    "_autoinit": 4,
    "_selectors": 4,
    "_pprint_registry": 4,
    "_pprint": 5,
    "_selection": 5,
    "_pprint_html": 6,
    "_calls": 6,
    "_at": 7,
    "_treeclass": 8,
    "optim": 8,
    "_checkpoint": 8,
    "_stacked": 8,
    "_periodic": 8,
    "_sharding": 8,
    "nn": 9,
    "__init__": 9,
}

# Inside a subpackage whose modules sit in folders, the folders are floors of their own:
# a module imports from its own folder or a lower one, never a higher one. The
# checkpoints: the protocols, files and processes at the bottom; names, checks and rules
# above them, reading checkpoints only through the protocols; the formats above both (a
# format may walk the template, as equinox's does); `_api` on top.
SUBFLOORS = {
    "_checkpoint": {"files": 0, "names": 1, "formats": 2, "_api": 3, "__init__": 4},
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _floor(module: str) -> int:
    # a subpackage's modules share the subpackage's floor
    return FLOORS[module.split(".")[0]]


def _resolve(module: str, node: ast.ImportFrom, path: pathlib.Path) -> str | None:
    """The package module an import names (`None` for other packages)."""
    if node.level == 0:
        if node.module is None or not node.module.startswith("treeclass"):
            return None
        name = node.module[len("treeclass") :].lstrip(".")
        return name or "__init__"
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if path.name == "__init__.py" and module == "__init__":
        here = []
    base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
    target = ".".join([*base, node.module] if node.module else base)
    return target or "__init__"


class Import:
    def __init__(self, source: str, target: str, names: list[str], line: int) -> None:
        self.source, self.target, self.names, self.line = source, target, names, line

    def __repr__(self) -> str:
        return f"{self.source}:{self.line} imports {self.names} from {self.target}"


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    """A file's syntax tree, parsed once per session (the tests here read every file)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def _imports() -> tuple[Import, ...]:
    modules = _modules()
    found = []
    for module, path in modules.items():
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(module, node, path)
                if target is None:
                    continue
                names = [a.name for a in node.names]
                # `from . import _node` imports the module `_node`, not a name of `__init__`
                submodules = [n for n in names if _join(target, n) in modules]
                if submodules:
                    for name in submodules:
                        found.append(Import(module, _join(target, name), [], node.lineno))
                    names = [n for n in names if n not in submodules]
                    if not names:
                        continue
                found.append(Import(module, target, names, node.lineno))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("treeclass"):
                        target = alias.name[len("treeclass") :].lstrip(".") or "__init__"
                        found.append(Import(module, target, [], node.lineno))
    return tuple(found)


def _join(package: str, name: str) -> str:
    return name if package == "__init__" else f"{package}.{name}"


def test_every_module_has_a_floor():
    unplaced = [m for m in _modules() if m.split(".")[0] not in FLOORS]
    assert not unplaced, f"give these modules a floor here and in docs/architecture.md: {unplaced}"


def test_no_import_from_a_higher_floor():
    upward = [
        i
        for i in _imports()
        if i.source.split(".")[0] != i.target.split(".")[0] and _floor(i.target) > _floor(i.source)
    ]
    assert not upward, "\n".join(map(repr, upward))


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for i in _imports():
        if i.source != i.target:
            graph.setdefault(i.source, set()).add(i.target)
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, [*stack, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_no_module_imports_another_modules_private_names():
    private = [
        i
        for i in _imports()
        if i.source.split(".")[0] != i.target.split(".")[0]
        and any(n.startswith("_") and not n.startswith("__") for n in i.names)
    ]
    assert not private, "\n".join(map(repr, private))


def test_no_module_reads_private_attributes_of_another_package_module():
    # `from . import _node` then `_node._thing`: a private name read through the module
    offenders = []
    modules = _modules()
    for module, path in modules.items():
        tree = _tree(path)
        imported = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level >= 1
            for alias in node.names
            if alias.name.startswith("_") and alias.name != module.split(".")[-1]
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in imported
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                offenders.append(f"{module}:{node.lineno} reads {node.value.id}.{node.attr}")
    assert not offenders, "\n".join(offenders)


def test_no_import_reaches_past_a_subpackages_front_door():
    # a subpackage (`_checkpoint`, `nn`) is entered through its `__init__`: what it keeps in
    # its own modules is its business, so no module outside it names one of them
    past = [
        i
        for i in _imports()
        if "." in i.target and i.source.split(".")[0] != i.target.split(".")[0]
    ]
    assert not past, "\n".join(map(repr, past))


def _subfloor(module: str) -> int | None:
    """A module's floor inside its subpackage (its folder's, or its own at the top)."""
    parts = module.split(".")
    floors = SUBFLOORS.get(parts[0])
    if floors is None:
        return None
    return floors[parts[1] if len(parts) > 1 else "__init__"]


def test_every_module_of_a_foldered_subpackage_has_a_floor_in_it():
    unplaced = [
        m
        for m in _modules()
        if m.split(".")[0] in SUBFLOORS
        and (m.split(".") + ["__init__"])[1] not in SUBFLOORS[m.split(".")[0]]
    ]
    assert not unplaced, f"give these a floor in SUBFLOORS and the package's README: {unplaced}"


def test_no_import_from_a_higher_folder_inside_a_subpackage():
    upward = []
    for i in _imports():
        here, there = _subfloor(i.source), _subfloor(i.target)
        same = i.source.split(".")[0] == i.target.split(".")[0]
        if same and here is not None and there is not None and there > here:
            upward.append(i)
    assert not upward, "\n".join(map(repr, upward))


@pytest.mark.parametrize("module", sorted(m for m in FLOORS if m != "__init__"))
def test_dunder_all_names_exist(module):
    import importlib

    mod = importlib.import_module(f"treeclass.{module}")
    missing = [n for n in getattr(mod, "__all__", []) if not hasattr(mod, n)]
    assert not missing, missing


def _names_used_from(module: str) -> set[str]:
    """Every name other package modules and the tests import from, or read off, `module`."""
    short = module.split(".")[-1]
    used = {n for i in _imports() if i.target == module and i.source != module for n in i.names}
    files = [p for m, p in _modules().items() if m != module]
    files += sorted(PACKAGE.parent.joinpath("tests").glob("*.py"))
    for path in files:
        tree = _tree(path)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == short
            ):
                used.add(node.attr)
    return {n for n in used if not n.startswith("__")}


def test_the_node_contract_lists_exactly_what_other_modules_use():
    import treeclass._node as node

    used = _names_used_from("_node")
    listed = set(node.__all__)
    assert not used - listed, f"used but not in _node.__all__: {sorted(used - listed)}"
    assert not listed - used, f"in _node.__all__ but used nowhere: {sorted(listed - used)}"


@pytest.mark.parametrize("module", ["_values", "_structure"])
def test_the_shared_vocabularies_list_every_name_others_use(module):
    import importlib

    mod = importlib.import_module(f"treeclass.{module}")
    used = {n for n in _names_used_from(module) if not n.startswith("_")}
    assert not used - set(mod.__all__), sorted(used - set(mod.__all__))


# a node kind's type is its own module's business: everything else asks the kind's row
# (`row_of(node).stack`, `.wrapper`, ...), so a new kind of the same shape works everywhere
_KIND_TYPES = {
    "Stacked": "_stacked",
    "StackBase": "_stacked",
    "Periodic": "_periodic",
    "Frozen": "_frozen",
}


def _type_tests(tree: ast.Module) -> list[tuple[int, str]]:
    """`(line, type name)` of every `isinstance`/`issubclass`/`type(x) is` test in `tree`."""

    def names(node: ast.expr) -> list[str]:
        if isinstance(node, ast.Tuple):
            return [n for element in node.elts for n in names(element)]
        if isinstance(node, ast.Attribute):
            return [node.attr]
        return [node.id] if isinstance(node, ast.Name) else []

    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            found += [(node.lineno, n) for n in names(node.args[1])]
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) for op in node.ops
        ):
            sides = [node.left, *node.comparators]
            if any(
                isinstance(s, ast.Call) and isinstance(s.func, ast.Name) and s.func.id == "type"
                for s in sides
            ):
                found += [(node.lineno, n) for s in sides for n in names(s)]
    return found


def test_no_module_outside_a_kinds_own_tests_for_its_type():
    offenders = [
        f"{module}:{line} tests for `{name}` (ask the node's row instead)"
        for module, path in _modules().items()
        for line, name in _type_tests(_tree(path))
        if name in _KIND_TYPES and module != _KIND_TYPES[name]
    ]
    assert not offenders, "\n".join(offenders)


def test_the_kind_type_check_sees_every_spelling_of_a_type_test():
    source = """
isinstance(x, Stacked)
isinstance(x, (int, _periodic.Periodic))
issubclass(cls, StackBase)
type(x) is Frozen
"""
    assert sorted(n for _, n in _type_tests(ast.parse(source))) == [
        "Frozen",
        "Periodic",
        "StackBase",
        "Stacked",
        "int",
    ]
    assert [n for _, n in _type_tests(ast.parse("type(x) == Frozen"))] == ["Frozen"]
