"""The shape of the package: each module's size and what it imports of smol, read from
the source (nothing is imported), any module over the house's length, and any circle
among those imports.

    python -m tests.house            # sizes, largest first; the import graph; circles
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOST_LINES = 400  # no module of smol is longer: split it by what it holds


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of smol."""
    out = {}
    for path in sorted((ROOT / "smol").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts).removesuffix(".__init__")] = path
    return out


def sizes() -> dict[str, int]:
    """Dotted name -> lines of every module of smol."""
    return {
        name: len(path.read_text(encoding="utf-8").splitlines())
        for name, path in modules().items()
    }


def too_long(lines: dict[str, int], most: int = MOST_LINES) -> list[str]:
    """'module: N lines' for each module of `lines` (name -> lines) over `most`,
    longest first."""
    over = sorted((n, name) for name, n in lines.items() if n > most)
    return [f"{name}: {n} lines" for n, name in reversed(over)]


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of smol that `name` imports anywhere in its file (a function's
    imports too: they make a circle as well, only later)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each circle that a depth-first walk meets, as [a, b, ..., a]."""
    state: dict[str, str] = {}
    found = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt, path)
        path.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            walk(node, [])
    return found


def main() -> None:
    lines = sizes()
    print("lines  module")
    for name, n in sorted(lines.items(), key=lambda item: -item[1]):
        print(f"{n:5}  {name}")
    over = too_long(lines)
    print(f"\n{len(over)} over {MOST_LINES} lines" + "".join(f"\n  {m}" for m in over))
    edges = graph()
    print("\nimports of smol, module by module")
    for name in sorted(edges):
        print(f"{name} -> {', '.join(sorted(edges[name])) or '-'}")
    found = circles(edges)
    print(f"\n{len(found)} circle{'s' * (len(found) != 1)}")
    for circle in found:
        print("  " + " -> ".join(circle))


if __name__ == "__main__":
    main()
