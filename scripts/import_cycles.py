"""Import circles inside ``src/dplang``: which modules import each other, directly or round a
longer loop.

Every import a module writes counts as an edge: at the top, inside a function (a lazy import
still depends on the module) and under ``if TYPE_CHECKING:`` (a type is a dependency too).
``from package import name`` points at ``package.name`` when that is a module, else at the
package. Imports made with ``importlib`` from a string (the registries loading their built-in
modules, the packages' lazy attributes) are not edges: they are looked up by name at run time.
A circle is a strongly connected component of more than one module.

    python scripts/import_cycles.py        # prints "import circles: none", or each circle
                                           # (exit code 1)

``tests/test_import_graph.py`` runs it: there is none.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "dplang"


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of ``package`` (``__init__`` files name
    their package)."""
    out: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: the modules of the package it imports}``."""
    modules = module_names(package)

    def owner(name: str) -> str | None:  # the longest prefix of ``name`` that is a module
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [owner(alias.name) for alias in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules
                           else owner(source) for alias in node.names]
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module, each sorted (Tarjan's
    algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return sorted(found)


def main() -> int:
    graph = import_graph()
    found = circles(graph)
    if not found:
        print("import circles: none")
        return 0
    print(f"import circles: {len(found)}")
    for component in found:
        print("  " + " ↔ ".join(component))
        for a in component:
            for b in sorted(graph[a] & set(component)):
                print(f"    {a} imports {b}")
    return 1

if __name__ == "__main__":
    sys.exit(main())
