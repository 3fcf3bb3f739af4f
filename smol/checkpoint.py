"""Checkpoints that resume training exactly: weights (safetensors), optimizer, schedule,
data position and RNG, with integrity checks.

A run keeps its checkpoints in root/step_NNNNNNN/{model.safetensors, state.pt,
manifest.json}, with a file `latest` naming the newest. manifest.json records the run's
id and the sha256 of every other file: a checkpoint whose files do not match it is
damaged, and a resume falls back to the newest intact one. Each is written to a
temporary folder, then renamed into place (atomic), then `latest` is replaced (atomic):
a crash mid-save never damages a checkpoint. Rotation deletes only older checkpoints of
the same run (the same run id), never another run's."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import torch


class CheckpointError(RuntimeError):
    """A checkpoint, saved model or adapter that is missing, incomplete or
    corrupted."""


def weights_to_save(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as contiguous CPU tensors, without a tied head: it is the
    embedding matrix itself, saved once (as transformers does; SmolLM.load_state_dict
    re-ties it)."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    return {
        k: v.detach().contiguous().cpu()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: equal digests, identical weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict:
    """Every random generator a training step draws from: torch, Python, CUDA."""
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:07d}"


MANIFEST = "manifest.json"
FILES = ("model.safetensors", "state.pt")


def save(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    state: dict,
    keep: int = 2,
    run_id: str = "",
) -> Path:
    """Write root/step_NNNNNNN (model.safetensors, state.pt and manifest.json, which
    records `run_id` and every file's sha256), point `latest` at it and delete all but
    the `keep` newest checkpoints of the same run. A failed write is an OSError."""
    root = Path(root)
    final = step_dir(root, step)
    for stale in root.glob(".step_*.tmp-*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    write_safetensors(weights_to_save(model), tmp / "model.safetensors")
    try:
        torch.save(state, tmp / "state.pt")
    except RuntimeError as e:  # torch's writer reports a full disk so
        raise OSError(f"cannot write {tmp / 'state.pt'}: {e}") from None
    write_manifest(tmp, FILES, run_id=run_id, step=step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".latest.tmp-{os.getpid()}"
    latest_tmp.write_text(final.name + "\n", encoding="utf-8")
    os.replace(latest_tmp, root / "latest")
    ours = [p for p in checkpoints(root) if p != final and _run_id(p) == run_id]
    for p in ours[: max(0, len(ours) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def checkpoints(root: str | Path) -> list[Path]:
    """The checkpoint folders under root, oldest first."""
    root = Path(root)
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []


def read_json(path: str | Path):
    """The JSON a file holds; a ValueError names the file when it holds none."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """Save tensors as a safetensors file; a failed write is an OSError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, path, metadata={"format": "pt"})
    except SafetensorError as e:  # safetensors' error for a full disk, say
        raise OSError(f"cannot write {path}: {e}") from None


def read_safetensors(path: str | Path, device="cpu") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a ValueError names a damaged file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device=str(device))
    except SafetensorError as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None


def write_manifest(folder: Path, files, **fields) -> None:
    """folder/manifest.json: `fields` and the sha256 of each of `files` in folder."""
    sha256 = {f: file_sha256(Path(folder) / f) for f in files}
    manifest = {**fields, "sha256": sha256}
    (Path(folder) / MANIFEST).write_text(
        json.dumps(manifest, indent=1) + "\n", encoding="utf-8"
    )


def verify_files(folder: Path, sha256: dict, what: str = "checkpoint") -> None:
    """Check each file of folder against its sha256 in the table; a CheckpointError
    names `what` and the file that is missing or damaged."""
    for name in sorted(sha256):
        if not (folder / name).is_file():
            raise CheckpointError(f"{what} {folder} is incomplete: {name} is missing")
        if file_sha256(folder / name) != sha256[name]:
            raise CheckpointError(
                f"{what} {folder} is corrupted: {name} does not match the "
                f"sha256 recorded in {MANIFEST}"
            )


def verify_saved(folder: str | Path, what: str) -> None:
    """Check a saved model's or adapter's files against its manifest.json, when it has
    one (folders written by other tools have none)."""
    folder = Path(folder)
    if (folder / MANIFEST).exists():
        try:
            verify_files(folder, read_manifest(folder, what)["sha256"], what)
        except CheckpointError as e:
            raise CheckpointError(
                f"{e} (delete {MANIFEST} to load files changed on purpose)"
            ) from None


def read_manifest(path: str | Path, what: str = "checkpoint") -> dict:
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
        if not isinstance(manifest.get("sha256"), dict):
            raise ValueError("no sha256 table")
        return manifest
    except FileNotFoundError:
        raise CheckpointError(
            f"{what} {path} is incomplete: it has no {MANIFEST}"
        ) from None
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(
            f"{what} {path} is corrupted: cannot read {MANIFEST} ({e})"
        ) from None


def _run_id(path: Path) -> str | None:
    try:
        return read_manifest(path).get("run_id")
    except CheckpointError:
        return None  # unknown origin: never rotated away


def verify(path: str | Path) -> dict:
    """The manifest of checkpoint `path`, after checking every file against its sha256
    in it; a CheckpointError names what is missing or damaged."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist")
    manifest = read_manifest(path)
    verify_files(path, {name: None for name in FILES} | manifest["sha256"])
    return manifest


def newest_intact(root: str | Path) -> tuple[Path, list[CheckpointError]]:
    """(the newest checkpoint under root whose files all match their manifest, the
    errors of the newer damaged ones skipped on the way)."""
    found = checkpoints(root)
    if not found:
        raise FileNotFoundError(
            f"no checkpoint to resume from in {root} (train once without resume, "
            f"or check the output folder, out_dir)"
        )
    damaged = []
    for path in reversed(found):
        try:
            verify(path)
            return path, damaged
        except CheckpointError as e:
            damaged.append(e)
    raise CheckpointError(
        f"no intact checkpoint to resume from in {root}: "
        + "; ".join(str(e) for e in damaged)
    )


def clear(root: str | Path) -> list[Path]:
    """Delete every checkpoint under root, `latest` and leftovers of crashed saves;
    returns the checkpoint folders removed."""
    root = Path(root)
    gone = checkpoints(root)
    for p in gone + list(root.glob(".step_*.tmp-*")):
        shutil.rmtree(p)
    (root / "latest").unlink(missing_ok=True)
    return gone


def check_writable(folder: str | Path, what: str) -> None:
    """Create `folder` if needed and write a file into it; an OSError names `what` and
    why not."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        why = not_a_folder(folder) or e.strerror or e
        raise OSError(f"cannot write to {what} {folder}: {why}") from None


def not_a_folder(folder: str | Path) -> str:
    """Why `folder` cannot hold an output where it or a parent, the nearest that
    exists, is a file ("" where that is a folder): every output's one wording."""
    for path in (Path(folder), *Path(folder).parents):
        if path.exists():
            return "" if path.is_dir() else f"{path} is a file, not a folder"
    return ""


def missing_folder(folder: str | Path) -> str:
    """Why `folder`, not a folder, cannot hold an output: a file in its way, or it
    does not exist."""
    return not_a_folder(folder) or f"the folder {folder} does not exist"


def load(path: str | Path, device="cpu") -> tuple[dict[str, torch.Tensor], dict]:
    """(weights on device, training state) of a checkpoint folder, after checking every
    file against the sha256 that manifest.json records for it."""
    from safetensors.torch import load_file

    path = Path(path)
    manifest = verify(path)
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        weights = load_file(path / "model.safetensors", device=str(device))
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} is corrupted: {e}") from e
    return weights, {**state, "run_id": manifest.get("run_id", "")}
