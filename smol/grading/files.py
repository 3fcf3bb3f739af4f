"""Writing what the grader produces: never over a file it did not write (a notebook,
above all), and atomically (a temporary file in the same folder, then `os.replace`), so
that a report is either the old one or the whole new one, whatever happens meanwhile.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable


def is_report(path: Path) -> bool:
    """Whether `path` holds a JSON report of `python -m smol.grade`."""
    try:
        if path.stat().st_size > 1 << 30:
            return False
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and {"score", "total", "notebooks"} <= set(report)


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
        return f"the folder {folder} does not exist"
    if path.exists() and not ours(path):
        return f"it exists and is not an earlier {what}, which the output would replace"
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(tmp)
    return ""


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` all at once: a reader sees the old file or the new one,
    never a part; OSError if it cannot be written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
