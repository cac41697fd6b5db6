"""The layout's rules, read from the source with `ast` (nothing is imported or run).

- storage/ imports no other part of the server but the shared names: the
  features (federation, experience, population, status, ...) keep their
  tables and files through it, never the other way round;
- no import cycle between the server's parts (a subpackage, or a module at
  the top of server/, is one part);
- client/ imports nothing from server/, and the server imports no torch;
- no module in server/ or common/ is over MAX_LINES lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"server": "fedrl.server", "client": "fedrl.client", "common": "fedrl.common"}
MAX_LINES = 700
STORAGE_MAY_IMPORT = frozenset({"storage", "names"})
"""The server parts storage/ may import: itself and the names every part shares."""


def modules(folder: str) -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every Python file under one top folder."""
    base = ROOT / folder
    for path in sorted(base.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join([FOLDERS[folder], *parts]), path


def imported(module: str, path: Path) -> set[str]:
    """Every module name an import statement of the file names, relative ones made absolute."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
            names.add(base)
            # `from fedrl.server import names` imports the module fedrl.server.names.
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def part(module: str) -> str | None:
    """The server part a module belongs to (its subpackage, or itself at the top); None outside."""
    prefix = "fedrl.server."
    if not module.startswith(prefix):
        return None
    return module[len(prefix) :].split(".", maxsplit=1)[0]


def part_graph() -> dict[str, set[str]]:
    """Which server parts import which (imports inside a part left out)."""
    known = {name for name, _ in modules("server")}
    graph: dict[str, set[str]] = {}
    for name, path in modules("server"):
        source = part(name)
        if source is None:
            continue
        targets = graph.setdefault(source, set())
        for target in imported(name, path):
            if target not in known:
                continue
            owner = part(target)
            if owner is not None and owner != source:
                targets.add(owner)
    return graph


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_storage_imports_no_feature() -> None:
    graph = part_graph()

    assert "storage" in graph
    assert graph["storage"] - STORAGE_MAY_IMPORT == set()


def test_no_import_cycle_between_server_parts() -> None:
    assert cycles(part_graph()) == []


def test_the_cycle_check_finds_a_cycle_through_three_parts() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}

    assert cycles(graph) == [["a", "b", "c"]]


def test_client_imports_nothing_from_the_server() -> None:
    offending = {
        name: sorted(target for target in imported(name, path) if part(target) is not None)
        for name, path in modules("client")
    }

    assert {name: found for name, found in offending.items() if found} == {}


def test_the_server_imports_no_torch() -> None:
    offending = {
        name
        for name, path in modules("server")
        if any(target.split(".")[0] == "torch" for target in imported(name, path))
    }

    assert offending == set()


@pytest.mark.parametrize("folder", ["server", "common"])
def test_no_module_is_over_the_line_limit(folder: str) -> None:
    lengths = {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules(folder)
    }

    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
