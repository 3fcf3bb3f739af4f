"""Write exercises/ from solutions/: every solution region becomes a stub, then the
notebook is run.

A region is the lines from `### BEGIN SOLUTION` to `### END SOLUTION` (as in
nbgrader). It becomes

    # YOUR CODE HERE
    raise NotImplementedError

at the indentation of the BEGIN line, so a region inside a function body leaves a
function that runs and raises when called. Cells that change lose their outputs, and the
whole exercise notebook is executed so that its stored outputs show the unsolved state
(every check failing, a zero total).

    python -m smol.grading.make_exercises            # write and execute exercises/
    python -m smol.grading.make_exercises --check    # exit 1 if exercises/ is stale
    (sources only)

Run it from the course repository's root (or pass --root): solutions/ and exercises/
are found there.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError")


def repo_root(path: str | Path | None = None) -> Path:
    """The course repository: `path`, else the current directory. It must hold
    solutions/."""
    root = Path.cwd() if path is None else Path(path)
    if not (root / "solutions").is_dir():
        raise FileNotFoundError(
            f"no solutions/ folder in {root.resolve()}: run this from the course "
            f"repository's root, or name the root (--root PATH)"
        )
    return root


def strip_solutions(source: str) -> str:
    """The source with each solution region replaced by a stub; raises ValueError on a
    broken region."""
    out, inside, begin_line = [], False, 0
    for i, line in enumerate(source.split("\n"), 1):
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise ValueError(
                    f"line {i}: {BEGIN} inside the region opened on line {begin_line}"
                )
            inside, begin_line = True, i
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + s for s in STUB]
        elif marker == END:
            if not inside:
                raise ValueError(f"line {i}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"line {begin_line}: {BEGIN} is never closed")
    return "\n".join(out)


def exercise_notebook(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The exercise version of a solution notebook (not executed)."""
    nb = copy.deepcopy(solution)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = strip_solutions(cell.source)
        if source != cell.source:
            cell.source, cell.outputs, cell.execution_count = source, [], None
    return nb


def sources(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def solution_paths(solutions: Path) -> list[Path]:
    return sorted(solutions.glob("*.ipynb"))


def stale(solutions: Path, exercises: Path) -> list[str]:
    """What differs between exercises/ and what solutions/ would generate (cell sources
    only)."""
    problems = []
    wanted = {p.name for p in solution_paths(solutions)}
    for path in solution_paths(solutions):
        target = exercises / path.name
        if not target.exists():
            problems.append(f"{target.name}: missing")
            continue
        want = sources(exercise_notebook(nbformat.read(path, as_version=4)))
        if sources(nbformat.read(target, as_version=4)) != want:
            problems.append(
                f"{target.name}: cell sources differ from solutions/{path.name}"
            )
    problems += [
        f"{p.name}: has no solution notebook"
        for p in exercises.glob("*.ipynb")
        if p.name not in wanted
    ]
    return problems


def execute(
    nb: nbformat.NotebookNode,
    cwd: Path,
    timeout: int = 600,
    record_timing: bool = False,
) -> None:
    """Run a notebook top to bottom in a fresh kernel of this environment, in place
    (outputs stored, as nbval compares them); cells run with `cwd` as their working
    directory."""
    from nbclient import NotebookClient

    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=record_timing,
        resources={"metadata": {"path": str(cwd)}},
    ).execute()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m smol.grading.make_exercises",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--root", type=Path, default=None, help="the course repository (default: here)"
    )
    parser.add_argument(
        "--solutions", type=Path, default=None, help="default: ROOT/solutions"
    )
    parser.add_argument(
        "--exercises", type=Path, default=None, help="default: ROOT/exercises"
    )
    parser.add_argument(
        "--check", action="store_true", help="only report whether exercises/ is stale"
    )
    parser.add_argument(
        "--no-execute", action="store_true", help="write without running the notebooks"
    )
    parser.add_argument(
        "names", nargs="*", help="only these solution notebooks (file names)"
    )
    args = parser.parse_args(argv)
    if args.solutions is None or args.exercises is None:
        try:
            root = repo_root(args.root)
        except FileNotFoundError as e:
            parser.error(str(e))
        args.solutions = args.solutions or root / "solutions"
        args.exercises = args.exercises or root / "exercises"
    if args.check:
        problems = stale(args.solutions, args.exercises)
        for p in problems:
            print("stale:", p)
        print(
            "exercises/ is stale: run `make exercises`"
            if problems
            else "exercises/ is up to date"
        )
        return 1 if problems else 0
    args.exercises.mkdir(exist_ok=True)
    for path in solution_paths(args.solutions):
        if args.names and path.name not in args.names:
            continue
        nb = exercise_notebook(nbformat.read(path, as_version=4))
        if not args.no_execute:
            execute(nb, args.exercises)
        nbformat.write(nb, args.exercises / path.name)
        print("wrote", args.exercises / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
