"""The user's text as a stream of documents: a text file, a folder of them, JSONL,
Parquet (a FineWeb or FineWeb-Edu shard, say), or a Hugging Face dataset streamed by
name.

A folder is read recursively in sorted order, taking the files whose names end in
.txt, .md, .text (text), .jsonl (one JSON object a line, its "text" field a document) or
.parquet (its "text" column, read one batch of rows at a time); hidden files and other
extensions are left out. A single file of another extension is read as text. A text
file is cut at blank lines into pieces of about PIECE_CHARS characters, which the
validation split holds out whole; a piece is marked as ending its document only at the
end of its file. Every bad input is a one-line ValueError naming the file and where."""

from __future__ import annotations

import codecs
import itertools
import json
import logging
from collections.abc import Iterator
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".text")
SUFFIXES = (*TEXT_SUFFIXES, ".jsonl", ".parquet")
HUB = "hf:"  # --data hf:NAME streams a Hugging Face dataset
PIECE_CHARS = 4096  # a text file's pieces: at least this long, cut at a blank line
READ_BYTES = 1 << 20
ROWS = 1024  # Parquet rows read at a time


def check(data: str, config: str = "", data_files: str = "") -> None:
    """A one-line ValueError where `data` cannot be a source: no such file or folder,
    a folder without a file to read, options that only a hub dataset takes."""
    if data.startswith(HUB):
        if not data[len(HUB) :]:
            raise ValueError(
                "data hf: needs a dataset's name, e.g. hf:roneneldan/TinyStories"
            )
        return
    if config or data_files:
        raise ValueError(
            "data_config and data_files are for a hub dataset (data hf:NAME), not "
            f"{data}"
        )
    path = Path(data)
    if not path.exists():
        raise ValueError(f"data {data}: no such file or folder")
    if path.is_dir() and not files(path):
        raise ValueError(
            f"data {data}: the folder holds no {', '.join(SUFFIXES)} file to train on"
        )


def files(path: Path) -> list[Path]:
    """The files a source path names: itself, or a folder's readable files, sorted by
    their path inside it."""
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and p.suffix.lower() in SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def identity(data: str, config: str = "", data_files: str = "") -> dict:
    """What the shards of a source depend on: a hub dataset's name and options, or every
    file's path, size and modification time (an edited file makes new shards)."""
    if data.startswith(HUB):
        return {"hub": data[len(HUB) :], "config": config, "data_files": data_files}
    path = Path(data).resolve()
    found = files(path)
    return {
        "path": str(path),
        "files": [
            [
                str(p.relative_to(path)) if p != path else p.name,
                s.st_size,
                s.st_mtime_ns,
            ]
            for p in found
            for s in [p.stat()]
        ],
    }


def text_bytes(data: str) -> int | None:
    """The size of a source made of text files only (for a progress bar), else None."""
    if data.startswith(HUB):
        return None
    found = files(Path(data))
    if any(p.suffix.lower() in (".jsonl", ".parquet") for p in found):
        return None
    return sum(p.stat().st_size for p in found)


def documents(
    data: str, config: str = "", data_files: str = ""
) -> Iterator[tuple[str, bool]]:
    """(text, ends_document) for each document or piece of the source, in order."""
    if data.startswith(HUB):
        yield from hub_rows(data[len(HUB) :], config, data_files)
        return
    for path in files(Path(data)):
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            yield from ((text, True) for text in jsonl_texts(path))
        elif suffix == ".parquet":
            yield from ((text, True) for text in parquet_texts(path))
        else:
            yield from text_pieces(path)


def text_pieces(path: Path) -> Iterator[tuple[str, bool]]:
    """A UTF-8 text file in pieces cut at blank lines, read a megabyte at a time; a NUL
    byte (a binary file) or bytes that are not UTF-8 are refused with their offset."""
    buf, held = "", None
    with open(path, "rb") as f:
        for text in decoded(path, f):
            buf += text
            while len(buf) >= PIECE_CHARS:
                end = buf.find("\n\n", PIECE_CHARS) + 2
                if end < 2:  # no blank line: a long line may not grow without end
                    if len(buf) < 8 * PIECE_CHARS:
                        break
                    end = max(buf.rfind("\n") + 1, PIECE_CHARS)
                if held is not None:
                    yield held, False
                held, buf = buf[:end], buf[end:]
    if buf:
        if held is not None:
            yield held, False
        held = buf
    if held is not None:
        yield held, True


def decoded(path: Path | str, f) -> Iterator[str]:
    """The binary stream `f` of the file `path` as UTF-8 text, READ_BYTES at a time; a
    NUL byte (a binary file) or bytes that are not UTF-8 are refused with their
    offset."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    while True:
        chunk = f.read(READ_BYTES)
        nul = chunk.find(b"\0")
        if nul >= 0:
            raise ValueError(
                f"{path} is a binary file, not text: a NUL byte at offset "
                f"{offset + nul}"
            )
        pending = len(decoder.getstate()[0])
        try:
            yield decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as e:
            at = offset - pending + e.start
            raise ValueError(
                f"{path} is not UTF-8 text: byte 0x{e.object[e.start]:02x} at "
                f"offset {at}"
            ) from None
        offset += len(chunk)
        if not chunk:
            return


def jsonl_texts(path: Path) -> Iterator[str]:
    """The "text" field of every line of a JSONL file (blank lines skipped)."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:  # UnicodeDecodeError is one
                raise ValueError(f"{path} line {n} is not UTF-8 JSON ({e})") from None
            if not isinstance(row, dict) or "text" not in row:
                has = (
                    f" (it has {', '.join(row) or 'none'})"
                    if isinstance(row, dict)
                    else ""
                )
                raise ValueError(f"{path} line {n} has no 'text' field{has}")
            if not isinstance(row["text"], str):
                raise ValueError(
                    f"{path} line {n}: 'text' is a {type(row['text']).__name__}, not a "
                    "string"
                )
            yield row["text"]


def parquet_texts(path: Path) -> Iterator[str]:
    """The "text" column of a Parquet file, ROWS rows at a time (memory stays flat);
    empty (null) texts are skipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path} is not a readable Parquet file ({e})") from None
    names = f.schema_arrow.names
    if "text" not in names:
        raise ValueError(
            f"{path} has no 'text' column (its columns: {', '.join(names) or 'none'})"
        )
    kind = f.schema_arrow.field("text").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(f"{path}: the 'text' column holds {kind}, not strings")
    with f:
        for batch in f.iter_batches(batch_size=ROWS, columns=["text"]):
            yield from (t for t in batch.column(0).to_pylist() if t)


def hub_rows(name: str, config: str, data_files: str) -> Iterator[tuple[str, bool]]:
    """A Hugging Face dataset's "train" rows, streamed with `datasets` (the network,
    or data_files on disk: e.g. name "parquet" with a local file)."""
    from datasets import load_dataset

    source = HUB + name + (f" (data_files {data_files})" if data_files else "")
    if name == "text" and data_files:
        check_local_text(data_files)
    rows = _from_hub(
        source,
        lambda: iter(
            load_dataset(
                name,
                config or None,
                data_files=data_files or None,
                split="train",
                streaming=True,
            )
        ),
    )
    for n in itertools.count():
        if (row := _from_hub(source, lambda: next(rows, None))) is None:
            return
        if "text" not in row:
            raise ValueError(
                f"row {n} of {source} has no 'text' field (it has {', '.join(row)})"
            )
        if not isinstance(row["text"], (str, type(None))):
            raise ValueError(
                f"row {n} of {source}: 'text' is a {type(row['text']).__name__}, not "
                "a string"
            )
        if row["text"]:
            yield row["text"], True


def check_local_text(data_files: str) -> None:
    """Each file on disk that data_files names, read (once more) as the datasets
    library's text builder reads it, decompressed where it is .gz, .xz, ..., and
    refused as a local text file is: that builder takes a NUL byte as text, and its
    non-UTF-8 error names no file."""
    from datasets.data_files import resolve_pattern
    from datasets.download.streaming_download_manager import StreamingDownloadManager
    from datasets.utils.file_utils import xopen

    if "://" in data_files:
        return  # not on disk
    try:
        found = resolve_pattern(data_files, base_path=str(Path.cwd()))
    except FileNotFoundError:
        return  # datasets' own error names it
    for name in found:
        if Path(name).is_file():
            try:
                with xopen(StreamingDownloadManager().extract(name), "rb") as f:
                    for _ in decoded(name, f):
                        pass
            except OSError as e:
                raise ValueError(f"{name} cannot be read ({e})") from None


def _from_hub(source: str, call):
    """call()'s result, the datasets library's own log lines held back: what it
    raises (a file that is not Parquet or JSON, a dataset it cannot reach) is one
    ValueError naming the source."""
    library = logging.getLogger("datasets")
    level = library.level
    library.setLevel(logging.CRITICAL)
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - datasets and pyarrow raise their own
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"data {source}: {message}") from None
    finally:
        library.setLevel(level)
