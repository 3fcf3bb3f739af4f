"""What the commands that write a run into a folder share (smol train, finetune, dpo,
grpo): the folder checked before any work (a usage error), which command made the run
a folder holds (a resume continues only its own), and --overwrite, which leaves the
earlier run as it was until the new one is done: the new run is written into a hidden
folder beside it, then its files take the place of the earlier run's. A new run that
fails or is stopped is discarded, and the earlier one is kept."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from smol.checkpoint import check_writable
from smol.commands.common import UsageError
from smol.train_report import log

# the settings file each tuning command keeps in OUT/training (a train run has none)
SETTINGS = {"finetune": "finetune.json", "dpo": "dpo.json", "grpo": "grpo.json"}


def check_out(folder: Path, what: str) -> None:
    """A folder a command would write that it cannot (unwritable, under a file) is
    a usage error, found before any work. The folders the check makes are removed
    again: a command refused later (a bad data line) leaves nothing behind."""
    folder = Path(folder)
    made = []  # the folders check_writable creates, innermost first
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    try:
        check_writable(made[0] if made else folder, what)
    except OSError as e:
        raise UsageError(str(e)) from None
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()


def removed_unless_done(folders: list[Path], work: Callable[[], int]) -> int:
    """work()'s status; each of `folders` that did not exist before it is removed
    again where work fails or is stopped (raises, or a status other than 0) and it
    holds no file by then: a run refused as its source is read leaves nothing behind,
    as check_out does, where one that saved a checkpoint keeps it."""
    new = [f for f in map(_first_made, folders) if f is not None]
    status = 1
    try:
        status = work()
        return status
    finally:
        if status != 0 and int(os.environ.get("RANK", "0")) == 0:
            for folder in new:
                for path, _, _ in sorted(os.walk(folder), reverse=True):
                    with contextlib.suppress(OSError):  # it holds a file: kept
                        os.rmdir(path)


def _first_made(folder: Path) -> Path | None:
    """The outermost of folder and its parents that does not exist yet (None: the
    folder exists): what making it makes."""
    folder, first = Path(folder), None
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        first, folder = folder, folder.parent
    return first


def made_by(folder: Path) -> str | None:
    """The command whose run `folder` holds (a tuning run's OUT or its training
    folder, a train run's out-dir): finetune, dpo, grpo or train; None: no run."""
    for verb, name in SETTINGS.items():
        if (folder / "training" / name).is_file() or (folder / name).is_file():
            return verb
    if (folder / "checkpoints").is_dir() or (folder / "summary.json").is_file():
        return "train"
    return None


def check_resumed_kind(folder: Path, verb: str, what: str) -> None:
    """A resume of another command's run is refused, before it is loaded."""
    other = made_by(folder)
    if other is not None and other != verb:
        raise UsageError(
            f"{what} {folder} holds a `smol {other}` run, not a `smol {verb}` one: "
            f"continue it with smol {other} --resume, or write elsewhere"
        )


def staging(out: Path) -> Path:
    """Where a run that replaces the one in `out` is written until it is done: a
    hidden folder beside it (the same on every rank)."""
    return out.parent / f".{out.name}.overwrite"


@contextlib.contextmanager
def replacing(stage: Path | None, out: Path):
    """While the block runs, the new run is written in `stage` (None: not
    replacing); a run that did not finish (an error, a signal) is discarded after
    it, saying that the earlier run in `out` is as it was."""
    if stage is None or int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    shutil.rmtree(stage, ignore_errors=True)  # a crashed replacement's
    try:
        yield
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
            log(
                f"overwrite: the new run did not finish and is discarded; the "
                f"earlier run in {out} is as it was"
            )


def replace_run(stage: Path, out: Path, names) -> None:
    """Put the finished run in `stage` in the place of the earlier one in `out`:
    that run's `names` there are deleted, then stage's files moved in (renames in
    one file system); what else `out` holds stays."""
    trash = out.parent / f".{out.name}.replaced"
    shutil.rmtree(trash, ignore_errors=True)
    trash.mkdir(parents=True)
    gone = [n for n in names if (out / n).exists() or (out / n).is_symlink()]
    for name in gone:
        os.replace(out / name, trash / name)
    out.mkdir(parents=True, exist_ok=True)
    for entry in stage.iterdir():
        os.replace(entry, out / entry.name)
    stage.rmdir()
    shutil.rmtree(trash)
    if gone:
        log(f"overwrite: replaced the earlier run's {', '.join(gone)} in {out}")
