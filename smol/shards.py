"""Token shards: a source (smol.sources) tokenized once into one flat array of token ids
per split, train.bin and val.bin (uint16 while the vocabulary fits, else uint32), with
manifest.json (source, tokenizer and its sha256, counts, dtype, each shard's sha256) and
the tokenizer itself, memory-mapped for training as nanoGPT and nanochat do. A folder
whose manifest matches the run is reused as it is; one that does not is refused, never
written over.

The validation split holds out whole documents: every k-th (the first, the k+1-th, ...)
with k = round(1 / val_fraction), the same on every run. Documents are joined by the
end-of-text id."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from smol import sources
from smol.checkpoint import file_sha256
from smol.distributed import on_main_rank
from smol.run_inputs import (
    check_fits,
    load_tokenizer,
    tokenizer_sha256,
    train_tokenizer,
)
from smol.tokenizer import Tokenizer

FORMAT = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
BATCH_CHARS = 1 << 22  # text handed to the batch encoder at once
BATCH_DOCS = 4096


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def val_every(val_fraction: float) -> int:
    """k: every k-th document is held out for validation."""
    return max(2, round(1 / val_fraction))


def encode_texts(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, by the library's batch encoder on every core."""
    backend = tokenizer.backend
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [e.ids for e in encode(texts, add_special_tokens=False)]


class ShardWriter:
    """One split's token ids appended to a temporary file, hashed as written."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.tmp, self.dtype = path, path.with_suffix(".bin.tmp"), dtype
        self.file, self.sha = open(self.tmp, "wb"), hashlib.sha256()
        self.tokens = self.documents = 0
        self.max_id = -1

    def write(self, ids: list[int]) -> None:
        if not ids:
            return
        array = np.asarray(ids, dtype=self.dtype)
        self.max_id = max(self.max_id, int(array.max()))
        self.file.write(data := array.tobytes())
        self.sha.update(data)
        self.tokens += len(ids)

    def discard(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def close(self) -> dict:
        self.file.close()
        os.replace(self.tmp, self.path)
        return {
            "file": self.path.name,
            "tokens": self.tokens,
            "documents": self.documents,
            "sha256": self.sha.hexdigest(),
        }


def key(cfg, tokenizer: str) -> dict:
    """What a folder's shards must have been made from to be reused by this run."""
    return {
        "format": FORMAT,
        "source": sources.identity(cfg.data, cfg.data_config, cfg.data_files),
        "tokenizer": tokenizer,
        "val_fraction": cfg.val_fraction,
        "max_tokens": cfg.max_tokens,
    }


def read_manifest(folder: Path) -> dict | None:
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        for field in ("key", "splits", "dtype", "tokenizer_sha256", "max_id"):
            manifest[field]  # noqa: B018 - a KeyError where it lacks one
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a shards manifest ({e})") from None
    return manifest


def mismatch(folder: Path, manifest: dict, wanted: dict) -> str:
    """One line saying why the shards in `folder` are not this run's."""
    saved, name = manifest["key"], manifest.get("tokenizer", "")
    end = f": give another --shards, or delete {folder} to tokenize again"
    if saved["tokenizer"] != wanted["tokenizer"]:
        return (
            f"the shards in {folder} were written by another tokenizer "
            f"({name} {saved['tokenizer']}; this run's: {wanted['tokenizer']}){end}"
        )
    if saved["source"] != wanted["source"]:
        old = saved["source"].get("path") or saved["source"].get("hub")
        return (
            f"the shards in {folder} were made from another source or version "
            f"({old}){end}"
        )
    differ = [k for k in wanted if saved.get(k) != wanted[k]]
    return (
        f"the shards in {folder} were made with other settings "
        f"({', '.join(f'{k} {saved.get(k)!r}' for k in differ)}){end}"
    )


def verify(folder: Path, manifest: dict) -> None:
    """A one-line ValueError where a shard's size or sha256 is not its manifest's."""
    itemsize = np.dtype(manifest["dtype"]).itemsize
    for split in SPLITS:
        entry = manifest["splits"][split]
        path = folder / entry["file"]
        if not path.is_file() or path.stat().st_size != entry["tokens"] * itemsize:
            raise ValueError(
                f"shard {path} is missing or truncated: the manifest says "
                f"{entry['tokens']} {manifest['dtype']} ids; delete {folder} to "
                "tokenize again"
            )
        if (sha := file_sha256(path)) != entry["sha256"]:
            raise ValueError(
                f"shard {path} is corrupted: its sha256 is {sha[:16]}..., the "
                f"manifest's {entry['sha256'][:16]}...; delete {folder} to tokenize "
                "again"
            )


def saved_tokenizer(folder: Path, manifest: dict) -> Tokenizer:
    tokenizer = Tokenizer.from_folder(folder / "tokenizer")
    if tokenizer_sha256(tokenizer) != manifest["tokenizer_sha256"]:
        raise ValueError(
            f"{folder / 'tokenizer'} is not the tokenizer the shards were written with "
            f"(its sha256 differs from {MANIFEST}'s); delete {folder} to tokenize again"
        )
    return tokenizer


def prepare(
    cfg,
    folder: Path,
    spec: str,
    tokenizer: Tokenizer | None,
    vocab_size: int,
    rebuild: bool = False,
) -> tuple[dict, bool]:
    """(manifest, reused): the shards of cfg.data in `folder`, reused when its manifest
    matches (verified: sizes and sha256), else written. `spec` names the tokenizer
    (bpe:N is trained here); `tokenizer`, when given, is it (the model's own). A
    tokenizer larger than vocab_size is refused before any work."""
    if tokenizer is None and not spec.startswith("bpe:"):
        tokenizer = load_tokenizer(spec)
    if tokenizer is not None:
        check_fits(tokenizer, vocab_size, f"tokenizer {spec}")
    # bpe:N is the same tokenizer for the same source; any other, its own hash
    label = spec if tokenizer is None else f"sha256:{tokenizer_sha256(tokenizer)[:16]}"
    wanted = key(cfg, label)
    manifest = read_manifest(folder)
    if manifest is not None and not rebuild:
        if manifest["key"] != wanted:
            raise ValueError(mismatch(folder, manifest, wanted))
        verify(folder, manifest)
        saved_tokenizer(folder, manifest)
        return manifest, True
    ours = [n for n in ("train.bin", "val.bin", "tokenizer") if (folder / n).exists()]
    if manifest is None and ours:
        raise ValueError(
            f"{folder} holds {', '.join(ours)} but no {MANIFEST}: not shards of "
            f"smol's, or shards cut short; give another --shards, or delete {folder}"
        )
    if tokenizer is None:
        k = val_every(cfg.val_fraction)
        docs = sources.documents(cfg.data, cfg.data_config, cfg.data_files)
        train_docs = (t for i, (t, _) in enumerate(docs) if i % k)
        tokenizer = train_tokenizer(spec, train_docs)
    return write(cfg, folder, tokenizer, wanted, spec), False


def write(cfg, folder: Path, tokenizer: Tokenizer, wanted: dict, name: str) -> dict:
    """Tokenize cfg.data into folder's train.bin and val.bin, batch by batch (memory
    stays flat), then the tokenizer and, last, the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)  # half-written shards never match
    dtype, k = dtype_for(tokenizer.vocab_size), val_every(cfg.val_fraction)
    out = {s: ShardWriter(folder / f"{s}.bin", dtype) for s in SPLITS}
    try:  # a failure or a signal leaves no temporary file behind
        _tokenize(cfg, tokenizer, out)
        if not any(w.tokens for w in out.values()):
            raise ValueError(f"data {cfg.data} holds no text")
        for split, writer in out.items():
            if not writer.tokens:
                raise ValueError(
                    f"data {cfg.data} holds one document (or piece) only: the "
                    f"{'validation' if split == 'val' else 'training'} split would "
                    "be empty; give more text"
                )
    except BaseException:
        for writer in out.values():
            writer.discard()
        raise
    splits = {s: w.close() for s, w in out.items()}
    tokenizer.save(folder / "tokenizer")
    manifest = {
        "key": wanted,
        "tokenizer": name,
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype.name,
        "max_id": max(w.max_id for w in out.values()),
        "val_every": k,
        "splits": splits,
    }
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)
    return manifest


def _tokenize(cfg, tokenizer: Tokenizer, out: dict[str, ShardWriter]) -> None:
    """cfg.data's documents, batch by batch through the batch encoder, into `out`'s
    writers, each document followed by the end-of-text id where it ends or where its
    split's next piece does not follow it in the text."""
    eot, k = tokenizer.eot_id, val_every(cfg.val_fraction)
    docs = enumerate(sources.documents(cfg.data, cfg.data_config, cfg.data_files))
    bar = tqdm(
        total=sources.text_bytes(cfg.data),
        unit="B",
        unit_scale=True,
        desc="tokenize",
        disable=not cfg.progress,
        dynamic_ncols=True,
    )
    total, limit = 0, cfg.max_tokens or float("inf")
    while total < limit and (batch := list(itertools.islice(_batch(docs), BATCH_DOCS))):
        ids = {s: [] for s in SPLITS}
        encoded = encode_texts(tokenizer, [text for _, (text, _) in batch])
        for (i, (text, ends)), doc in zip(batch, encoded):
            # the end-of-text id where the document ends or its split's next piece
            # does not follow it in the text
            if ends or i % k == 0 or (i + 1) % k == 0:
                doc.append(eot)
            split = "val" if i % k == 0 else "train"
            ids[split] += doc
            out[split].documents += 1
            total += len(doc)
            bar.update(len(text.encode("utf-8")))
            if total >= limit:
                break
        for split, writer in out.items():
            writer.write(ids[split])
        bar.set_postfix(tokens=f"{total:,}", refresh=False)
    bar.close()


def _batch(docs):
    """Documents from `docs` up to BATCH_CHARS characters (at least one)."""
    chars = 0
    for item in docs:
        yield item
        chars += len(item[1][0])
        if chars >= BATCH_CHARS:
            return


def open_shards(
    folder: Path, manifest: dict, vocab_size: int, seq_len: int
) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    """(tokenizer, train ids (N,), val ids (M,)) memory-mapped, after checking that they
    fit a model of vocab_size and a window of seq_len + 1 tokens."""
    tokenizer = saved_tokenizer(folder, manifest)
    check_fits(tokenizer, vocab_size, f"the tokenizer of the shards in {folder}")
    if manifest["max_id"] >= tokenizer.vocab_size:
        raise ValueError(
            f"the shards in {folder} hold id {manifest['max_id']}, beyond their "
            f"tokenizer's {tokenizer.vocab_size} tokens; delete {folder} to tokenize "
            "again"
        )
    if manifest["dtype"] != dtype_for(tokenizer.vocab_size).name:
        raise ValueError(
            f"the shards in {folder} hold {manifest['dtype']} ids, which do not fit a "
            f"tokenizer of {tokenizer.vocab_size} tokens; delete {folder} to tokenize "
            "again"
        )
    arrays = []
    for split in SPLITS:
        n = manifest["splits"][split]["tokens"]
        if n < seq_len + 1:
            raise ValueError(
                f"the {'validation' if split == 'val' else 'training'} split of the "
                f"shards in {folder} has {n} tokens, fewer than a window of "
                f"seq_len + 1 = {seq_len + 1}: give more text or a shorter --seq-len"
            )
        path = folder / manifest["splits"][split]["file"]
        arrays.append(np.memmap(path, dtype=manifest["dtype"], mode="r", shape=(n,)))
    return tokenizer, *arrays


def training_streams(
    cfg, vocab_size: int, rank: int = 0, world_size: int = 1, tokenizer=None
) -> tuple[Tokenizer, np.ndarray, np.ndarray, dict]:
    """(tokenizer, train ids, val ids, what the data is) for a run on cfg.data: the
    main rank reuses or writes the shards (cfg.shards, else OUT_DIR/data, which
    overwrite may write again), then every rank maps them; the tokenizer is saved into
    OUT_DIR/tokenizer for generation. `tokenizer`: the model's own (init)."""
    folder = Path(cfg.shards) if cfg.shards else Path(cfg.out_dir) / "data"
    spec = f"init {cfg.init}" if tokenizer is not None else cfg.tokenizer
    made = {}

    def make() -> None:
        rebuild = cfg.overwrite and not cfg.shards
        made["manifest"], made["reused"] = prepare(
            cfg, folder, spec, tokenizer, vocab_size, rebuild
        )

    on_main_rank(make, rank, world_size)
    manifest = made.get("manifest") or read_manifest(folder)
    tok, train, val = open_shards(folder, manifest, vocab_size, cfg.seq_len)
    if rank == 0:
        tok.save(Path(cfg.out_dir) / "tokenizer")
    splits = manifest["splits"]
    info = {
        "source": cfg.data,
        "shards": str(folder),
        "reused": made.get("reused", True),
        "tokenizer": manifest["tokenizer"],
        "vocab_size": tok.vocab_size,
        "dtype": manifest["dtype"],
        "train_tokens": splits["train"]["tokens"],
        "val_tokens": splits["val"]["tokens"],
        "train_documents": splits["train"]["documents"],
        "val_documents": splits["val"]["documents"],
        "val_every": manifest["val_every"],
        "stream": splits["train"]["sha256"],
    }
    return tok, train, val, info


def describe(info: dict) -> str:
    """One line on the data of a run."""
    return (
        f"data {info['source']}: {info['train_tokens']:,} training tokens, "
        f"{info['val_tokens']:,} validation tokens (1 document in {info['val_every']} "
        f"held out: {info['val_documents']:,} of "
        f"{info['train_documents'] + info['val_documents']:,}); {info['tokenizer']} "
        "tokenizer, "
        f"{info['vocab_size']:,} tokens; shards {info['shards']} "
        f"({'reused' if info['reused'] else 'written'})"
    )
