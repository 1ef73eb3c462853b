#!/usr/bin/env python3
"""Fails when modules import each other in a circle (CI runs it from scripts/lint.sh).

Two graphs, one node per source file:

* Python: the `vllm_rs` package (python/vllm_rs). An edge for every
  `import vllm_rs.x` / `from vllm_rs.x import y` / relative import, wherever it
  stands (a function-level import is still a dependency), except under
  `if TYPE_CHECKING:`, which never runs. `from pkg import name` where `name` is
  a submodule points at that submodule.
* Rust: every crate under rust/ and frontend-bin/. An edge for every path
  through `crate::` or `super::` that names another file's module, in `use`
  items and in expressions alike. A module and its ancestors are one concern
  (a parent declares and re-exports its children), so edges between them are
  not counted.

A strongly connected component of more than one file is a circle; each is
printed with the edges that make it. Only the standard library is used.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON_PACKAGE = ROOT / "python" / "vllm_rs"
RUST_CRATE_PARENTS = [ROOT / "rust", ROOT]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; returns the components of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
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
                    components.append(sorted(component))
    return components


# --- Python -----------------------------------------------------------------


def python_modules(package: Path) -> dict[str, Path]:
    """{dotted module name: file} for every module of the package."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` blocks."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for inner in node.body:
                    for sub in ast.walk(inner):
                        skipped.add(id(sub))
    return skipped


def python_graph(package: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports}."""
    modules = python_modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _type_checking_nodes(tree)
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base if is_package else base[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets.add(source)
                targets.update(f"{source}.{alias.name}" for alias in node.names)
        edges = set()
        for target in targets:
            # The longest module the dotted name starts with.
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            resolved = ".".join(parts)
            if parts and resolved != name and not name.startswith(resolved + "."):
                edges.add(resolved)
        graph[name] = edges
    return graph


# --- Rust -------------------------------------------------------------------

_PATH = re.compile(r"\b(crate|super)((?:::\s*(?:super|[A-Za-z_][A-Za-z0-9_]*))+)")
_USE_GROUP = re.compile(r"\buse\s+(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def rust_crates() -> list[Path]:
    """Every crate folder (a Cargo.toml beside a src/) this script checks."""
    crates = []
    for parent in RUST_CRATE_PARENTS:
        for manifest in sorted(parent.glob("*/Cargo.toml")):
            if (manifest.parent / "src").is_dir():
                crates.append(manifest.parent)
    return crates


def rust_modules(src: Path) -> dict[tuple[str, ...], Path]:
    """{module path under the crate root: file} for every .rs file under src/."""
    modules = {}
    for path in sorted(src.rglob("*.rs")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts == ["lib"] or parts == ["main"]:
            parts = []
        elif parts[-1] == "mod":
            parts.pop()
        if parts and parts[0] == "bin":
            continue
        modules[tuple(parts)] = path
    return modules


def _expand_groups(text: str) -> str:
    """`use crate::a::{b, c::d};` -> `crate::a::b crate::a::c::d` (one level of braces)."""

    def expand(match: re.Match) -> str:
        head = match.group(1) + match.group(2)
        names = [item.strip().split(" as ")[0] for item in match.group(3).split(",")]
        return " ".join(f"{head}::{name}" for name in names if name and name[0] != "{")

    return _USE_GROUP.sub(expand, text)


def rust_graph(src: Path) -> dict[str, set[str]]:
    """{file: the crate's other files it names}, ancestors excluded."""
    modules = rust_modules(src)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        text = _expand_groups(_COMMENT.sub("", path.read_text()))
        edges = set()
        for match in _PATH.finditer(text):
            segments = [s.strip() for s in match.group(2).split("::") if s.strip()]
            if match.group(1) == "crate":
                base: list[str] = []
            else:
                # `super` is the parent of the file's own module; each further
                # `super` one more level up.
                base = list(module[:-1])
                while segments and segments[0] == "super":
                    segments.pop(0)
                    base = base[:-1]
            target = base + segments
            while target and tuple(target) not in modules:
                target.pop()
            target_t = tuple(target)
            if target_t == module or module[: len(target_t)] == target_t or target_t[: len(module)] == module:
                continue
            edges.add(str(modules[target_t].relative_to(ROOT)))
        graph[str(path.relative_to(ROOT))] = edges
    return graph


def report(kind: str, graph: dict[str, set[str]]) -> int:
    """Prints each circle of the graph with its edges; returns how many there are."""
    circles = strongly_connected(graph)
    for members in circles:
        inside = set(members)
        print(f"import circle in {kind}: {', '.join(members)}")
        for member in members:
            for target in sorted(graph[member] & inside):
                print(f"  {member} -> {target}")
    return len(circles)


def main(argv: Iterable[str]) -> int:
    del argv
    found = report("python/vllm_rs", python_graph(PYTHON_PACKAGE))
    for crate in rust_crates():
        found += report(str(crate.relative_to(ROOT)), rust_graph(crate / "src"))
    if found:
        print(f"{found} import circle(s)", file=sys.stderr)
        return 1
    print("no import circles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
