"""The files the grader reads and writes. It reads a notebook as untrusted input (a file
that is not one says what it is instead), and a file a kernel wrote without following a
link or waiting on a pipe. It writes never over a file it did not write (a notebook,
above all), and atomically (a temporary file in the same folder, then `os.replace`), so
that a report is either the old one or the whole new one, whatever happens meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

import nbformat

from smol.checkpoint import missing_folder


def is_regular(path: Path) -> bool:
    """Whether `path` is a regular file (not a device such as /dev/full, whose reads
    never end, nor a pipe, whose reads wait)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def first_line(path: Path, limit: int = 4096) -> str | None:
    """The first line of a regular text file (at most `limit` characters); None for
    anything else."""
    if not is_regular(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline(limit).rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return None


def is_report(path: Path) -> bool:
    """Whether `path` holds a JSON report of `smol grade` (its own report, or the
    Gradescope results it writes, which name it in their extra data)."""
    try:
        if not is_regular(path) or path.stat().st_size > 1 << 30:
            return False
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(report, dict):
        return False
    extra = report.get("extra_data")
    ours = isinstance(extra, dict) and extra.get("graded_by") == "smol grade"
    return ours or {"score", "total", "notebooks"} <= set(report)


def output_problem(path: Path, ours: Callable[[Path], bool], what: str) -> str:
    """Why the grader must not write `path` ("" when it may): a folder, a notebook,
    a missing or unwritable folder, or a file that `ours` does not recognise as an
    earlier `what`. Leaves nothing behind."""
    if path.is_dir():
        return "it is a folder"
    if path.suffix == ".ipynb":
        return "it is a notebook, which the output would replace"
    folder = path.parent
    if not folder.is_dir():
        return missing_folder(folder)
    if path.exists() and not is_regular(path):
        return "it is not a regular file (a device or a pipe?): name a file"
    if path.exists() and not ours(path):
        return f"it exists and is not an earlier {what}, which the output would replace"
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(tmp)
    return ""


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write `text` (UTF-8) or bytes to `path` all at once: a reader sees the old file
    or the new one, never a part; OSError if it cannot be written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at `path`; ValueError saying what the file is instead."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    if not data.strip():
        raise ValueError("is empty, not a notebook")
    try:
        text = data.decode("utf-8")
        content = json.loads(text)
    except UnicodeDecodeError:
        raise ValueError("is not a notebook (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"is not a notebook (invalid JSON: {exc.msg} at line {exc.lineno})"
        ) from None
    if not isinstance(content, dict) or "nbformat" not in content:
        raise ValueError("is JSON but not a Jupyter notebook (no nbformat field)")
    try:
        nb = nbformat.reads(text, as_version=4)
        if not isinstance(nb.get("cells"), list) or not all(
            isinstance(c, dict) and "cell_type" in c for c in nb.cells
        ):
            raise ValueError("no list of cells")
        for cell in nb.cells:
            if not isinstance(cell.get("source"), str):
                raise ValueError("a cell without source text")
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds
        text = str(exc).strip()
        reason = text.splitlines()[0] if text else type(exc).__name__
        raise ValueError(f"is not a Jupyter notebook ({reason[:120]})") from None
    return nb


def read_regular(path: Path, limit: int) -> bytes | None:
    """A regular file's bytes (None when it is missing, not a regular file or over
    `limit` bytes): the kernel wrote it, so it may be anything."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def earlier_grades(path: Path, grader: str) -> dict[tuple[str, str, str], dict]:
    """(student, exercise, hash) -> a notebook's report, from the class report at
    `path` if it was made by this same grader."""
    try:
        report = json.loads(path.read_text())
        return {
            (n["student"], n["exercise"], n["sha256"]): n
            for n in report["notebooks"]
            if n.get("grader") == grader and not n.get("retry")
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def earlier_students(path: Path) -> set[str]:
    """The students of the class report at `path`, those it marks missing too (none
    if there is no such report)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        return {n["student"] for n in report["notebooks"] + report.get("missing", [])}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def earlier_notebooks(path: Path) -> list[dict]:
    """The notebooks (student, exercise, tasks) of the class report at `path`, and
    those it marks missing, so that a notebook stays missing run after run (none if
    there is no such report)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        return [
            n
            for n in report["notebooks"] + report.get("missing", [])
            if isinstance(n, dict) and {"student", "exercise", "tasks"} <= set(n)
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def sha256_of(path: Path) -> str | None:
    """The file's SHA-256 (None when it cannot be read)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def written_record(path: Path) -> dict:
    """What the class report at `path` says its run wrote: {"submissions": the
    folder graded, "gradebook": its SHA-256, "feedback": {page name: SHA-256}};
    {} when there is no such report, or it predates the record."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))["written"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return record if isinstance(record, dict) else {}
