"""The package's shape (tests/house.py): no import circle, no module over 400 lines,
and the command lines in smol/commands/ only, so that the library's modules hold
none."""

import ast

import pytest

from tests import house

# Modules beside smol/commands/ that run as a program: `python -m smol`, the exercises'
# generator, and the rebuild of the shipped tokenizer that smol/assets/NOTICE.md
# describes.
PROGRAMS = {"smol.__main__", "smol.grading.make_exercises", "smol.data"}
# Library modules that, run as a program (`python -m smol.train`), only say which
# command runs them (tests/test_commands.py runs them).
POINTERS = {"smol.train", "smol.finetune"}


def without_a_pointer(tree: ast.Module) -> ast.Module:
    """The module without its last statement where that is `if __name__ ==
    "__main__":` whose body only prints a line and raises SystemExit(2)."""
    last = tree.body[-1]
    if isinstance(last, ast.If) and ast.unparse(last.test) == "__name__ == '__main__'":
        printed, exits = (ast.unparse(s) for s in last.body)
        assert printed.startswith("print(") and exits == "raise SystemExit(2)", (
            ast.unparse(last)
        )
        tree.body = tree.body[:-1]
    return tree


def test_no_module_of_smol_imports_itself_back():
    assert house.circles(house.graph()) == []


def test_circles_are_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert house.circles(edges) == [["a", "b", "c", "a"]]
    assert house.circles({"a": {"b"}, "b": set()}) == []


def check_lengths(lines: dict[str, int]) -> None:
    """Fail naming each module of `lines` (name -> lines) over the house's length."""
    over = house.too_long(lines)
    assert not over, (
        f"over {house.MOST_LINES} lines, to split by what they hold: {', '.join(over)}"
    )


def test_no_module_of_smol_is_over_400_lines():
    assert house.MOST_LINES == 400
    check_lengths(house.sizes())


def test_a_module_over_400_lines_is_named_with_its_length():
    check_lengths({"smol.a": 400, "smol.b": 12})
    fake = {"smol.a": 400, "smol.b": 401, "smol.commands.c": 999}
    assert house.too_long(fake) == ["smol.commands.c: 999 lines", "smol.b: 401 lines"]
    with pytest.raises(AssertionError, match=r"smol\.commands\.c: 999 lines, smol\.b"):
        check_lengths(fake)


def test_only_the_commands_parse_command_lines_or_run_as_programs():
    for name, path in house.modules().items():
        if name.startswith("smol.commands") or name in PROGRAMS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if name in POINTERS:
            tree = without_a_pointer(tree)
        imported = {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "argparse" not in imported, f"{name} parses a command line"
        assert not any(str(m).startswith("smol.commands") for m in imported), name
        assert "__main__" not in ast.unparse(tree), (
            f"{name} runs as a program: its command belongs in smol/commands/"
        )
