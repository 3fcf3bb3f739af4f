"""Gradescope's autograder for one exercise, as the zip Gradescope takes: `setup.sh`
(run once, as root, to build the image) installs Python, PyTorch's CPU wheel as the
Makefile pins it, and smol from the source in the zip with the versions
requirements.txt pins; `run_autograder` (run for each submission) grades the
student's notebook of the exercise, found under /autograder/submission by name or by
its check cells, into /autograder/results/results.json. SMOL_AUTOGRADER_ROOT
stands for /autograder and SMOL_AUTOGRADER_PYTHON for the Python that setup.sh
installs, so that both scripts run in a folder of one's own.
"""

from __future__ import annotations

import io
import re
import shlex
import stat
import zipfile
from pathlib import Path

import smol

REPOSITORY = Path(smol.__file__).resolve().parents[1]
CPU_WHEELS = "https://download.pytorch.org/whl/cpu"
# what `smol grade` needs beside smol's own dependencies (the dev extra's grading part)
GRADING = ("nbclient", "nbformat", "ipykernel", "cloudpickle")
SOURCE = ("pyproject.toml", "README.md")  # what pip builds smol from, with smol/
STAMP = (2020, 1, 1, 0, 0, 0)  # every file's time in the zip: the same zip each build

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image:
# Python, PyTorch {torch} (the CPU wheel), then smol (the source beside this file)
# with what `smol grade` needs, at the versions the course pins (constraints.txt).
set -euo pipefail
source_dir="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
root="${{SMOL_AUTOGRADER_ROOT:-/autograder}}"
apt-get install -y -q python3 python3-venv python3-pip
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {{
    echo "the course's pins need Python 3.11 or later: choose a newer Ubuntu image" >&2
    exit 1
}}
python3 -m venv "$root/venv"
pip=("$root/venv/bin/python" -m pip install -q)
"${{pip[@]}}" --upgrade pip
"${{pip[@]}}" torch=={torch} --index-url {wheels}
"${{pip[@]}}" -c "$source_dir/constraints.txt" "$source_dir/smol-source" {grading}
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: `smol grade` finds the student's
# notebook of {exercise} under submission/ (by name, or by its check cells), grades
# it in a fresh kernel and writes results/results.json, even for a hand-in it cannot
# grade (its output then says why). Exit status 0 once the results are written.
root="${{SMOL_AUTOGRADER_ROOT:-/autograder}}"
python="${{SMOL_AUTOGRADER_PYTHON:-$root/venv/bin/python}}"
mkdir -p "$root/results"
rm -f "$root/results/results.json"
"$python" -m smol grade "$root/submission" --exercise {exercise} \\
    --format gradescope --json "$root/results/results.json"{options}
test -s "$root/results/results.json"
"""


def pinned_torch(makefile: Path = REPOSITORY / "Makefile") -> str:
    """The PyTorch release the Makefile installs ("2.13.0")."""
    found = re.findall(r"(?m)^TORCH\s*:?=\s*torch==(\S+)", makefile.read_text())
    if len(found) != 1:
        raise ValueError(f"{makefile} does not pin one torch release (TORCH := ...)")
    return found[0]


def constraints(requirements: Path = REPOSITORY / "requirements.txt") -> str:
    """The pins (`name==version`) of requirements.txt, as pip's constraints."""
    pins = re.findall(r"(?m)^([A-Za-z0-9._-]+==\S+)", requirements.read_text())
    return "\n".join(pins) + "\n"


def repository_problem() -> str:
    """Why the zip cannot be built from this installation ("" when it can): it
    bundles smol's source, which a checkout of the repository holds."""
    needed = [*SOURCE, "Makefile", "requirements.txt"]
    missing = [n for n in needed if not (REPOSITORY / n).is_file()]
    if missing:
        return (
            f"--autograder bundles smol's source from a checkout of its repository; "
            f"{REPOSITORY} has no {', '.join(missing)}"
        )
    return ""


def _files() -> list[tuple[str, Path]]:
    """(name in the zip, file) of smol's source: the package and what pip reads."""
    package = REPOSITORY / "smol"
    out = [(f"smol-source/{n}", REPOSITORY / n) for n in SOURCE]
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            out.append((f"smol-source/{path.relative_to(REPOSITORY)}", path))
    return out


def _add(zf: zipfile.ZipFile, name: str, data: bytes, executable: bool) -> None:
    info = zipfile.ZipInfo(name, STAMP)
    mode = 0o755 if executable else 0o644
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def autograder_zip(exercise: str, options: list[str]) -> bytes:
    """The zip of the autograder for `exercise` (01_rmsnorm), `options` (time limits,
    hidden checks, visibility) passed on to each grading."""
    torch = pinned_torch()
    setup = SETUP.format(torch=torch, wheels=CPU_WHEELS, grading=" ".join(GRADING))
    extra = " \\\n    " + " ".join(map(shlex.quote, options)) if options else ""
    run = RUN.format(exercise=exercise, options=extra)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        _add(zf, "setup.sh", setup.encode(), True)
        _add(zf, "run_autograder", run.encode(), True)
        _add(zf, "constraints.txt", constraints().encode(), False)
        for name, path in _files():
            _add(zf, name, path.read_bytes(), False)
    return buffer.getvalue()


def is_autograder_zip(path: Path) -> bool:
    """Whether `path` holds an autograder zip this command wrote."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return {"setup.sh", "run_autograder", "constraints.txt"} <= names
