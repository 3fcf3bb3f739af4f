"""The survey's cases of `smol train --data SOURCE` (tests/bad_inputs.py): sources that
cannot be read or hold too little (a binary or non-UTF-8 file, named with the byte; an
empty corpus, one shorter than a window; a JSONL line or a Parquet file without text;
a hub dataset's file that is not Parquet, or not text), tokenizers that do not fit the
model or cannot be read, token shards of another tokenizer or source, corrupted, cut
short or with a dtype their tokenizer does not fit, --init weights that cannot be
loaded or options that conflict with them, outputs that cannot be written, another
command's run resumed, and SIGTERM or Ctrl-C while the source is tokenized."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

from tests.bad_inputs import Argv, Case, refused, stop_at
from tests.bad_inputs_fresh import UNWRITABLE, a_run_of

T = "texts"  # the folder of make_data_files' sources, under the files' folder
# a run small enough that a case accepted by mistake ends in seconds
SMALL = (
    "--steps 2 --warmup-steps 0 --batch-size 2 --seq-len 32 --eval-batches 1 "
    "--sample-tokens 0 --no-progress --device cpu"
).split()


def make_data_files(root: Path) -> None:
    """The sources the cases name, under root/texts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from smol.data import load_plays

    texts = root / T
    texts.mkdir()
    play = next(iter(load_plays().values()))
    (texts / "plays.txt").write_text(play[:40_000], encoding="utf-8")
    (texts / "bin.txt").write_bytes(b"To be\0 or not")
    (texts / "latin1.txt").write_bytes("Fran\u00e7ais\n".encode("latin-1"))
    (texts / "mixed").mkdir()
    (texts / "mixed" / "a.txt").write_text("To be, or not to be.\n", encoding="utf-8")
    (texts / "mixed" / "b.md").write_bytes(b"ok\n\xff\n")
    (texts / "empty.txt").write_bytes(b"")
    (texts / "blank").mkdir()
    for name in ("a.txt", "b.md"):
        (texts / "blank" / name).write_bytes(b"")
    (texts / "notes").mkdir()
    (texts / "notes" / "notes.csv").write_text("a,b\n", encoding="utf-8")
    (texts / "one.txt").write_text("A single short document.\n", encoding="utf-8")
    lines = {
        "short.jsonl": ['{"text": "To be."}', '{"text": "Or not."}'],
        "rows.jsonl": ['{"text": "To be."}', '{"body": "Or not."}'],
        "numbers.jsonl": ['{"text": 5}'],
        "bad.jsonl": ['{"text": "To be."}', '{"text": "Or n'],
    }
    for name, rows in lines.items():
        (texts / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    pq.write_table(pa.table({"body": ["To be."]}), texts / "no_text.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), texts / "numbers.parquet")
    (texts / "junk.parquet").write_text("not parquet\n", encoding="utf-8")
    (texts / "notok").mkdir()
    (texts / "notok" / "tokenizer.json").write_text("{}", encoding="utf-8")


def train(*more: str) -> Argv:
    """`smol train --out-dir FOLDER/run`, `more` (@PATH: PATH under the files'
    folder), then SMALL."""

    def argv(r: Path) -> list[str]:
        given = [str(r / a[1:]) if a.startswith("@") else a for a in more]
        return ["--out-dir", str(r / "run"), *given, *SMALL]

    return argv


def data(name: str, *more: str) -> Argv:
    """`--data FOLDER/texts/NAME` and `more`, as train() takes them."""
    return train("--data", f"@{T}/{name}", *more)


def wide_tokenizer(root: Path) -> None:
    """texts/wide.json: a byte-level tokenizer of 70,000 tokens (more than uint16
    holds, more than the tiny model's 4096)."""
    from tests.test_data_sources import wide_tokenizer_file

    wide_tokenizer_file(root / T / "wide.json")


def no_eot_tokenizer(root: Path) -> None:
    """texts/noeot.json: a tokenizer without <|endoftext|>."""
    from tokenizers import Tokenizer, models

    vocab = {"[UNK]": 0, "To": 1, "be": 2}
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(root / T / "n.json"))


def shards_then(change: str) -> Callable[[Path], None]:
    """A setup: shards/, the shards of texts/plays.txt by the shakespeare tokenizer
    (what `--data texts/plays.txt` on the tiny preset writes), then `change`d."""

    def setup(root: Path) -> None:
        from smol import data as corpus
        from smol import shards
        from smol.train_config import TrainConfig

        plays, folder = root / T / "plays.txt", root / "shards"
        cfg = TrainConfig(data=str(plays), out_dir=str(root / "x"), progress=False)
        shards.prepare(cfg, folder, "shakespeare", None, 4096)
        manifest = json.loads((folder / "manifest.json").read_text())
        if change == "corrupted":
            raw = bytearray((folder / "val.bin").read_bytes())
            raw[len(raw) // 2] ^= 1
            (folder / "val.bin").write_bytes(raw)
        elif change == "cut":
            with open(folder / "train.bin", "r+b") as f:
                f.truncate(100)
        elif change == "uint8":  # sizes and sha256 still agree with the files
            manifest["dtype"] = "uint8"
            for split in manifest["splits"].values():
                split["tokens"] *= 2
            (folder / "manifest.json").write_text(json.dumps(manifest))
        elif change == "manifest":
            (folder / "manifest.json").write_text("{not json")
        elif change == "no manifest":
            (folder / "manifest.json").unlink()
        elif change == "tokenizer":
            corpus.load_tokenizer("smollm2").save(folder / "tokenizer")
        elif change == "source":
            with open(plays, "a", encoding="utf-8") as f:
                f.write("\n\nExeunt.\n")

    return setup


def on_shards(change: str, says: str, *more: str, keep: str | None = None) -> Case:
    return Case(
        "train",
        data("plays.txt", "--shards", "@shards", *more),
        1,
        says,
        keep=keep,
        about=f"--data $TMP/texts/plays.txt --shards $TMP/shards ({change}) "
        + " ".join(more),
        setup=shards_then(change),
    )


def data_cases() -> list[Case]:
    t = "train"

    def source(name: str, says: str, status: int = 1, gone: str | None = "run"):
        """--data texts/NAME, refused; the out-dir it made removed again."""
        return Case(t, data(name), status, says, gone=gone)

    cases = [
        source("bin.txt", "bin.txt is a binary file, not text: a nul byte at offset 5"),
        source("latin1.txt", "latin1.txt is not utf-8 text: byte 0xe7 at offset 4"),
        source("mixed", "mixed/b.md is not utf-8 text: byte 0xff at offset 3"),
        source("empty.txt", "empty.txt holds no text"),
        source("blank", "blank holds no text"),
        source("one.txt", "one.txt holds one document (or piece) only"),
        source("short.jsonl", "fewer than a window of seq_len + 1 = 33", gone=None),
        source("rows.jsonl", "rows.jsonl line 2 has no 'text' field (it has body)"),
        source("numbers.jsonl", "numbers.jsonl line 1: 'text' is a int"),
        source("bad.jsonl", "bad.jsonl line 2 is not utf-8 json"),
        source("no_text.parquet", "no_text.parquet has no 'text' column"),
        source("numbers.parquet", "numbers.parquet: the 'text' column holds int64"),
        source("junk.parquet", "junk.parquet is not a readable parquet file"),
        source("notes", "holds no .txt", 2),
        source("nowhere", "nowhere: no such file or folder", 2),
        Case(
            t,
            data("plays.txt", "--max-tokens", "1"),
            1,
            "split would be empty",
            gone="run",
        ),
        *refused(
            t,
            lambda *more: train(*more),
            "--data hf: -> hf:",
            "--data-files x.parquet -> need data",
            "--data-config sample-10BT -> need data",
            "--shards shards -> need data",
            "--tokenizer bpe:512 -> give data too",
            "--tokenizer smollm2 -> smollm2 has 49152 tokens",
            "--set vocab_size=1000 -> auto (shakespeare) has 4096 tokens",
            "--tokenizer bpe:100 -> bpe:n",
            "--val-fraction 0.9 -> val_fraction",
            "--max-tokens -1 -> max_tokens",
            "--init smollm2 --tokenizer bpe:512 -> own tokenizer",
            "--init smollm2 --tokenizer shakespeare -> own tokenizer",
            "--init smollm2 --set num_hidden_layers=1 -> cannot change it",
        ),
        Case(t, data("plays.txt", "--tokenizer", "smollm2"), 2, "49152 tokens"),
        Case(t, data("plays.txt", "--tokenizer", "bpe:8192"), 2, "bpe:8192"),
        Case(t, data("plays.txt", "--init", f"@{T}/nowhere"), 2, "nowhere"),
    ]
    for name, says in (
        ("junk.parquet", "junk.parquet): parquet magic bytes not found"),
        ("numbers.parquet", "numbers.parquet): 'text' is a int, not a string"),
        ("no_text.parquet", "no_text.parquet) has no 'text' field (it has body)"),
        ("gone.parquet", "gone.parquet"),
    ):
        cases.append(
            Case(
                t,
                lambda r, n=name: (
                    train("--data", "hf:parquet")(r) + ["--data-files", str(r / T / n)]
                ),
                1,
                says,
            )
        )
    for name, says in (  # the datasets library's text builder, refused as --data is
        ("bin.txt", "bin.txt is a binary file, not text: a nul byte at offset 5"),
        ("latin1.txt", "latin1.txt is not utf-8 text: byte 0xe7 at offset 4"),
    ):
        cases.append(
            Case(
                t,
                lambda r, n=name: (
                    train("--data", "hf:text")(r) + ["--data-files", str(r / T / n)]
                ),
                1,
                says,
                gone="run",
            )
        )
    cases += [
        Case(
            t,
            data("plays.txt", "--tokenizer", f"@{T}/wide.json"),
            1,
            "wide.json has 70000 tokens; the model's vocab_size is 4096",
            setup=wide_tokenizer,
        ),
        Case(
            t,
            data("plays.txt", "--tokenizer", f"@{T}/n.json"),
            1,
            "n.json has no <|endoftext|> token",
            setup=no_eot_tokenizer,
        ),
        Case(t, data("plays.txt", "--tokenizer", f"@{T}/notok"), 1, "not a readable"),
        Case(
            t, data("plays.txt", "--tokenizer", f"@{T}/notes"), 1, "no tokenizer.json"
        ),
        Case(t, data("plays.txt", "--tokenizer", f"@{T}/bin.txt"), 1, "bin.txt"),
        Case(
            t,
            data("plays.txt", "--init", "smollm2", "--tokenizer", f"@{T}/wide.json"),
            1,
            "is not the tokenizer of init smollm2",
            setup=wide_tokenizer,
        ),
    ]
    for name, says in (
        ("gpt2", "gpt2"),
        ("junk.gguf", "junk.gguf"),
        ("empty.gguf", "empty.gguf"),
        ("file.txt", "file.txt"),
        ("folder", "no config.json in"),
        ("badweights", "model.safetensors"),
        ("badconfig", "config.json"),
    ):
        cases.append(
            Case(
                t,
                lambda r, n=name: data("plays.txt")(r) + ["--init", str(r / n)],
                1,
                says,
            )
        )
    cases += [
        on_shards(
            "another tokenizer's",
            "were written by another tokenizer",
            "--tokenizer",
            "bpe:512",
            "--set",
            "vocab_size=512",
            keep="shards/train.bin",
        ),
        on_shards(
            "corrupted", "val.bin is corrupted: its sha256", keep="shards/val.bin"
        ),
        on_shards("cut", "train.bin is missing or truncated"),
        on_shards("uint8", "hold uint8 ids, which do not fit a tokenizer of 4096"),
        on_shards("manifest", "manifest.json is not a shards manifest"),
        on_shards("no manifest", "but no manifest.json", keep="shards/train.bin"),
        on_shards("tokenizer", "is not the tokenizer the shards were written with"),
        on_shards("source", "were made from another source or version"),
        Case(t, data("plays.txt", "--out-dir", f"{UNWRITABLE}/run"), 2, UNWRITABLE),
        Case(
            t,
            lambda r: data("plays.txt")(r) + ["--out-dir", str(r / "file.txt" / "r")],
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(t, data("plays.txt", "--shards", f"{UNWRITABLE}/s"), 2, "shards /sys/s"),
        Case(
            t,
            lambda r: data("plays.txt")(r) + ["--shards", str(r / "file.txt")],
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(
            t,
            lambda r: (
                data("plays.txt")(r)
                + ["--out-dir", str(r / "finetune_run"), "--resume"]
            ),
            2,
            "smol finetune",
            keep="finetune_run/model.safetensors",
            about="--data $TMP/texts/plays.txt --out-dir $TMP/finetune_run --resume "
            "(a smol finetune run)",
            setup=a_run_of("finetune"),
        ),
        *(
            Case(
                t,
                data("plays.txt"),
                status,
                "nothing was saved",
                about=f"--data $TMP/texts/plays.txt, {name} while it is tokenized",
                fault=stop_at("smol.shards", "encode_texts", 1, signum),
                gone="run",  # no half-written shard, no empty folder
            )
            for signum, status, name in (
                (signal.SIGTERM, 143, "SIGTERM"),
                (None, 130, "Ctrl-C"),
            )
        ),
    ]
    return cases
