"""Training on your own text: sources read as documents (smol.sources), tokenized once
into memory-mapped shards with a manifest (smol.shards), and every bad input refused in
one line naming the file and where."""

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smol import data, shards, sources
from smol.run_inputs import tokenizer_sha256
from smol.train_config import TrainConfig

FINEWEB_EDU_COLUMNS = (
    "text",
    "id",
    "dump",
    "url",
    "file_path",
    "language",
    "language_score",
    "token_count",
    "score",
    "int_score",
)


def fineweb_edu_parquet(path, texts, row_group_size=4):
    """A Parquet file in FineWeb-Edu's schema, as a user downloads one shard of it."""
    n = len(texts)
    columns = {
        "text": texts,
        "id": [f"<urn:uuid:{i:08d}>" for i in range(n)],
        "dump": ["CC-MAIN-2024-10"] * n,
        "url": [f"https://example.org/{i}" for i in range(n)],
        "file_path": ["s3://commoncrawl/crawl-data/x.warc.gz"] * n,
        "language": ["en"] * n,
        "language_score": pa.array([0.97] * n, pa.float64()),
        "token_count": pa.array([len(t) // 4 for t in texts], pa.int64()),
        "score": pa.array([3.2] * n, pa.float64()),
        "int_score": pa.array([3] * n, pa.int64()),
    }
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def plays(n=6, chars=None):
    texts = list(data.load_plays().values())[:n]
    return [t[:chars] for t in texts] if chars else texts


def config(tmp_path, source, **changes) -> TrainConfig:
    return TrainConfig(
        data=str(source),
        out_dir=str(tmp_path / "run"),
        progress=False,
        seq_len=32,
        **changes,
    )


# sources


def test_a_text_file_is_cut_at_blank_lines_into_pieces_that_rebuild_it(tmp_path):
    text = plays(1)[0]
    path = tmp_path / "play.txt"
    path.write_text(text, encoding="utf-8")
    pieces = list(sources.text_pieces(path))
    assert "".join(p for p, _ in pieces) == text  # nothing lost or doubled
    assert [end for _, end in pieces] == [False] * (len(pieces) - 1) + [True]
    assert len(pieces) > 20
    for piece, _ in pieces[:-1]:
        assert len(piece) >= sources.PIECE_CHARS and piece.endswith("\n\n")


def test_a_folder_is_read_recursively_in_sorted_order_by_extension(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "b" / "two.md").write_text("two", encoding="utf-8")
    (tmp_path / "a.txt").write_text("one", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text('{"text": "three"}\n\n{"text": "four"}\n')
    fineweb_edu_parquet(tmp_path / "d.parquet", ["five", "six"])
    (tmp_path / "e.csv").write_text("not read")
    (tmp_path / ".hidden" / "x.txt").write_text("not read")
    (tmp_path / "b" / ".notes.txt").write_text("not read")
    docs = list(sources.documents(str(tmp_path)))
    assert docs == [(t, True) for t in ("one", "two", "three", "four", "five", "six")]


def test_a_binary_file_is_named_with_the_offset_of_its_nul_byte(tmp_path):
    path = tmp_path / "model.bin.txt"
    path.write_bytes(b"text first " + b"\0\1\2")
    with pytest.raises(
        ValueError, match=r"model.bin.txt is a binary file.* offset 11$"
    ):
        list(sources.documents(str(path)))


@pytest.mark.parametrize("at", [3, 10, 11, 25])
def test_a_file_that_is_not_utf8_is_named_with_the_offset_of_the_bad_byte(
    tmp_path, monkeypatch, at
):
    # reads of 9 bytes: the first ends inside the two bytes of "\u00ef" (8 and 9), so
    # the bad byte comes after a character the decoder held back between reads (an
    # offset counted per read, or without the bytes held back, is wrong)
    monkeypatch.setattr(sources, "READ_BYTES", 9)
    good = "caf\u00e9 na\u00efve text here, long enough".encode()
    path = tmp_path / "latin1.txt"
    path.write_bytes(good[:at] + b"\xff" + good[at:])
    with pytest.raises(ValueError) as e:
        list(sources.documents(str(path)))
    assert str(e.value) == f"{path} is not UTF-8 text: byte 0xff at offset {at}"


def test_a_jsonl_line_without_text_is_named_by_its_number(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "fine"}\n\n{"content": "x", "id": 3}\n')
    with pytest.raises(ValueError) as e:
        list(sources.documents(str(path)))
    assert str(e.value) == f"{path} line 3 has no 'text' field (it has content, id)"
    path.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(ValueError, match=r"rows.jsonl line 2 is not UTF-8 JSON"):
        list(sources.documents(str(path)))


def test_a_parquet_file_without_a_text_column_names_the_columns_it_has(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"content": ["a"], "url": ["u"]}), path)
    with pytest.raises(ValueError) as e:
        list(sources.documents(str(path)))
    assert str(e.value) == f"{path} has no 'text' column (its columns: content, url)"


def test_parquet_is_read_in_batches_of_rows_never_whole(tmp_path, monkeypatch):
    texts = [f"document {i}" for i in range(50)]
    path = fineweb_edu_parquet(tmp_path / "shard.parquet", texts, row_group_size=8)
    batches = []
    real = pq.ParquetFile.iter_batches

    def counted(self, *args, **kwargs):
        for batch in real(self, *args, **kwargs):
            batches.append(batch.num_rows)
            yield batch

    def whole(*args, **kwargs):
        raise AssertionError("the whole file was read at once")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    monkeypatch.setattr(pq.ParquetFile, "read", whole)
    monkeypatch.setattr(pq, "read_table", whole)
    monkeypatch.setattr(sources, "ROWS", 8)
    assert [t for t, _ in sources.documents(str(path))] == texts
    assert batches == [8] * 6 + [2]


def test_the_hub_path_streams_a_fineweb_edu_shard_offline_through_datasets(tmp_path):
    texts = plays(12, chars=500)
    path = fineweb_edu_parquet(tmp_path / "000_00000.parquet", texts)
    assert pq.read_schema(path).names == list(FINEWEB_EDU_COLUMNS)
    docs = list(sources.documents("hf:parquet", data_files=str(path)))
    assert docs == [(t, True) for t in texts]


def test_a_bad_hub_source_is_one_error_naming_it_and_no_log_line(tmp_path, capfd):
    """What the datasets library raises while streaming is a ValueError naming the
    source, its own error line held back, and a text that is not a string is
    refused: before, a file that is not Parquet printed datasets' line on stderr and
    then pyarrow's message, naming no file, and a column of numbers reached the
    tokenizer as ints (a TypeError's traceback)."""
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet\n")
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), numbers)
    no_text = tmp_path / "no_text.parquet"
    pq.write_table(pa.table({"body": ["a"]}), no_text)
    for path, says in (
        (junk, "Parquet magic bytes not found"),
        (numbers, "row 0 of hf:parquet (data_files {}): 'text' is a int, not a "),
        (no_text, "row 0 of hf:parquet (data_files {}) has no 'text' field (it has b"),
        (tmp_path / "gone.parquet", "Unable to find"),
    ):
        with pytest.raises(ValueError) as e:
            list(sources.documents("hf:parquet", data_files=str(path)))
        assert str(path) in str(e.value) and says.format(path) in str(e.value)
        assert "\n" not in str(e.value)
        assert capfd.readouterr().err == ""


def test_the_hub_s_text_builder_refuses_a_local_file_as_data_refuses_it(tmp_path):
    """hf:text with --data-files FILE reads FILE as --data FILE does: the datasets
    library's text builder took a NUL byte as text (the binary file trained on) and
    said of bytes that are not UTF-8 'position 3' of a chunk, naming no file. A
    compressed file is read decompressed, as that builder reads it (a check of its raw
    bytes would refuse every .gz), and its offset counts the text's bytes."""
    import gzip

    cases = {
        "model.txt": (b"text first \0\1\2", "is a binary file, not text: a NUL byte"),
        "latin1.txt": (b"caf\xe9 na", "is not UTF-8 text: byte 0xe9"),
        "z.txt.gz": (gzip.compress(b"ok\n\xffx"), "is not UTF-8 text: byte 0xff"),
    }
    for name, (raw, says) in cases.items():
        (path := tmp_path / name).write_bytes(raw)
        with pytest.raises(ValueError) as local:
            list(sources.documents(str(path)))
        with pytest.raises(ValueError) as hub:
            list(sources.documents("hf:text", data_files=str(path)))
        assert str(hub.value) == str(local.value) or name.endswith(".gz")
        assert str(hub.value).startswith(f"{path} {says} at offset ")
    assert str(hub.value).endswith("offset 3")
    (fine := tmp_path / "fine.txt.gz").write_bytes(gzip.compress(b"To be\n\xc3\xa9\n"))
    docs = list(sources.documents("hf:text", data_files=str(fine)))
    assert docs == [("To be", True), ("\u00e9", True)]
    cfg = config(
        tmp_path,
        "hf:text",
        data_files=str(tmp_path / "model.txt"),
        tokenizer="shakespeare",
    )
    folder = tmp_path / "s"
    with pytest.raises(ValueError, match="model.txt is a binary file"):
        shards.prepare(cfg, folder, "shakespeare", None, 4096)
    assert list(folder.iterdir()) == []


# shards


def test_shards_hold_each_split_s_documents_with_end_of_text_ids(tmp_path):
    texts = plays(40, chars=300)
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = config(tmp_path, path, tokenizer="shakespeare", val_fraction=0.1)
    tok = data.load_tokenizer("shakespeare")
    manifest, reused = shards.prepare(cfg, tmp_path / "s", "shakespeare", None, 4096)
    assert not reused and manifest["dtype"] == "uint16" and manifest["val_every"] == 10
    _, train, val = shards.open_shards(tmp_path / "s", manifest, 4096, 32)
    assert isinstance(train, np.memmap) and train.dtype == np.uint16

    def stream(docs):
        return [i for t in docs for i in [*tok.encode(t), tok.eot_id]]

    # documents 0, 10, 20, 30 held out whole
    assert val.tolist() == stream(texts[::10])
    assert train.tolist() == stream([t for i, t in enumerate(texts) if i % 10])
    for split, array in (("train", train), ("val", val)):
        entry = manifest["splits"][split]
        assert entry["tokens"] == len(array)
        assert entry["documents"] == (4 if split == "val" else len(texts) - 4)
    assert manifest["max_id"] == max(train.max(), val.max())
    assert manifest["tokenizer_sha256"] == tokenizer_sha256(tok)


def test_a_text_file_s_pieces_keep_their_text_and_end_where_the_split_breaks(tmp_path):
    text = plays(1)[0]
    path = tmp_path / "play.txt"
    path.write_text(text, encoding="utf-8")
    cfg = config(tmp_path, path, tokenizer="shakespeare", val_fraction=0.25)
    manifest, _ = shards.prepare(cfg, tmp_path / "s", "shakespeare", None, 4096)
    tok, train, val = shards.open_shards(tmp_path / "s", manifest, 4096, 32)
    pieces = [p for p, _ in sources.text_pieces(path)]
    kept = tok.decode(train.tolist()).split("<|endoftext|>")
    # pieces 1-3, 5-7, ... run on without a separator; the held-out 0, 4, ... stand
    # alone
    assert kept[:-1] == ["".join(pieces[i : i + 3]) for i in range(1, len(pieces), 4)]
    assert tok.decode(val.tolist()).split("<|endoftext|>")[:-1] == pieces[::4]


@pytest.mark.parametrize("vocab, dtype", [(65536, np.uint16), (65537, np.uint32)])
def test_ids_are_stored_in_uint16_while_the_vocabulary_fits(vocab, dtype):
    assert shards.dtype_for(vocab) == dtype


def wide_tokenizer_file(path, size=70_000):
    """A byte-level tokenizer.json of `size` tokens (more than uint16 holds)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(sorted(byte_level))}
    vocab.update({f"w{i}": len(vocab) + i for i in range(size - 1 - len(byte_level))})
    backend = Tokenizer(models.BPE(vocab, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|endoftext|>"])
    backend.save(str(path))
    assert backend.get_vocab_size() == size
    return path


def test_a_vocabulary_beyond_uint16_is_stored_in_uint32(tmp_path):
    tok_path = wide_tokenizer_file(tmp_path / "tokenizer.json")
    path = tmp_path / "a.txt"
    path.write_text("\n\n".join(plays(2)), encoding="utf-8")
    cfg = config(tmp_path, path, tokenizer=str(tok_path))
    manifest, _ = shards.prepare(cfg, tmp_path / "s", str(tok_path), None, 70_000)
    assert manifest["dtype"] == "uint32" and manifest["max_id"] == 69_999
    tok, train, _ = shards.open_shards(tmp_path / "s", manifest, 70_000, 32)
    assert train.dtype == np.uint32 and tok.vocab_size == 70_000
    with pytest.raises(
        ValueError, match=r"has 70000 tokens; the model's vocab_size is"
    ):
        shards.prepare(cfg, tmp_path / "t", str(tok_path), None, 4096)
    assert not (tmp_path / "t").exists()  # refused before any work


@pytest.fixture
def made(tmp_path):
    """Shards of two plays made with a BPE of 512 tokens trained on them."""
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(plays(2)), encoding="utf-8")
    cfg = config(tmp_path, path, tokenizer="bpe:512")
    folder = tmp_path / "shards"
    manifest, reused = shards.prepare(cfg, folder, "bpe:512", None, 512)
    assert not reused
    return cfg, folder, manifest


def test_shards_are_reused_without_tokenizing_when_the_manifest_matches(
    made, monkeypatch
):
    cfg, folder, manifest = made
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}

    def never(*args):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(shards, "encode_texts", never)
    monkeypatch.setattr(shards, "train_tokenizer", never)
    again, reused = shards.prepare(cfg, folder, "bpe:512", None, 512)
    assert reused and again == manifest
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}
    assert after == before


def test_the_bpe_is_trained_on_the_training_documents_and_saved(made):
    cfg, folder, manifest = made
    tok, train, _ = shards.open_shards(folder, manifest, 512, 32)
    assert tok.vocab_size == 512 and tok.eot_id is not None
    assert manifest["dtype"] == "uint16" and manifest["tokenizer"] == "bpe:512"
    text = open(cfg.data, encoding="utf-8").read()
    assert tok.decode(train[:200].tolist()) in text
    assert len(text) / len(train) > 2  # a trained BPE, not bytes


def test_shards_of_another_tokenizer_are_refused_in_one_line(made):
    cfg, folder, _ = made
    cfg = replace(cfg, tokenizer="shakespeare")
    with pytest.raises(ValueError) as e:
        shards.prepare(cfg, folder, "shakespeare", None, 4096)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(
        f"the shards in {folder} were written by another tokenizer (bpe:512 bpe:512; "
        "this run's: sha256:"
    )
    assert msg.endswith(f"give another --shards, or delete {folder} to tokenize again")


def test_shards_of_an_edited_source_are_refused(made):
    cfg, folder, _ = made
    with open(cfg.data, "a", encoding="utf-8") as f:
        f.write("\n\nExeunt.\n")
    with pytest.raises(ValueError, match="were made from another source or version"):
        shards.prepare(cfg, folder, "bpe:512", None, 512)


def test_a_corrupted_shard_is_refused_by_its_sha256(made):
    cfg, folder, _ = made
    raw = bytearray((folder / "train.bin").read_bytes())
    raw[len(raw) // 2] ^= 1
    (folder / "train.bin").write_bytes(raw)
    with pytest.raises(ValueError) as e:
        shards.prepare(cfg, folder, "bpe:512", None, 512)
    assert str(e.value).startswith(
        f"shard {folder / 'train.bin'} is corrupted: its sha256 is "
    )
    with open(folder / "val.bin", "r+b") as f:
        f.truncate(10)
    (folder / "train.bin").write_bytes(raw[:-2])
    with pytest.raises(ValueError, match="train.bin is missing or truncated"):
        shards.prepare(cfg, folder, "bpe:512", None, 512)


def test_a_manifest_whose_dtype_cannot_hold_the_tokenizer_is_refused(made):
    cfg, folder, manifest = made
    with pytest.raises(
        ValueError, match=r"has 512 tokens; the model's vocab_size is 100"
    ):
        shards.open_shards(folder, manifest, 100, 32)
    manifest["dtype"] = "uint8"
    with pytest.raises(
        ValueError, match=r"hold uint8 ids, which do not fit a tokenizer"
    ):
        shards.open_shards(folder, manifest, 512, 32)


def test_an_empty_corpus_and_one_shorter_than_a_window_are_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    cfg = config(tmp_path, tmp_path / "empty", tokenizer="shakespeare")
    with pytest.raises(ValueError, match=r"empty holds no text$"):
        shards.prepare(cfg, tmp_path / "s1", "shakespeare", None, 4096)
    (tmp_path / "one.txt").write_text("A single short document.")
    cfg = config(tmp_path, tmp_path / "one.txt", tokenizer="shakespeare")
    with pytest.raises(
        ValueError, match=r"one.txt holds one document \(or piece\) only"
    ):
        shards.prepare(cfg, tmp_path / "s2", "shakespeare", None, 4096)
    (tmp_path / "two.jsonl").write_text('{"text": "To be."}\n{"text": "Or not."}\n')
    cfg = config(tmp_path, tmp_path / "two.jsonl", tokenizer="shakespeare")
    manifest, _ = shards.prepare(cfg, tmp_path / "s3", "shakespeare", None, 4096)
    with pytest.raises(ValueError) as e:
        shards.open_shards(tmp_path / "s3", manifest, 4096, 32)
    n = manifest["splits"]["train"]["tokens"]
    assert str(e.value) == (
        f"the training split of the shards in {tmp_path / 's3'} has {n} tokens, fewer "
        "than a window of seq_len + 1 = 33: give more text or a shorter --seq-len"
    )


def test_max_tokens_stops_at_the_document_that_reaches_it(tmp_path):
    path = tmp_path / "docs.jsonl"
    texts = plays(30, chars=200)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = data.load_tokenizer("shakespeare")
    lengths = [len(tok.encode(t)) + 1 for t in texts]
    limit = sum(lengths[:7]) - 1  # reached within the 7th document
    cfg = config(tmp_path, path, tokenizer="shakespeare", max_tokens=limit)
    manifest, _ = shards.prepare(cfg, tmp_path / "s", "shakespeare", None, 4096)
    splits = manifest["splits"]
    assert splits["train"]["tokens"] + splits["val"]["tokens"] == sum(lengths[:7])


def test_a_checkpoint_of_another_token_stream_is_refused():
    tokens = np.arange(200, dtype=np.uint16)
    batches = data.Batches(data.PackedWindows(tokens, 8, identity="a" * 64), 2)
    next(batches)
    state = batches.state_dict()
    assert state == {"position": 2, "stream": "a" * 64}
    other = data.Batches(data.PackedWindows(tokens, 8, identity="b" * 64), 2)
    with pytest.raises(ValueError, match="trained on the token stream aaaa"):
        other.load_state_dict(state)
    same = data.Batches(data.PackedWindows(tokens, 8, identity="a" * 64), 2)
    same.load_state_dict(state)
    assert same.position == 2


def test_windows_read_from_a_memory_map_equal_those_of_a_tensor(tmp_path):
    ids = np.random.default_rng(0).integers(0, 4096, 1000).astype(np.uint16)
    ids.tofile(tmp_path / "x.bin")
    mapped = np.memmap(tmp_path / "x.bin", dtype=np.uint16, mode="r")
    import torch

    a = data.PackedWindows(mapped, 16, seed=3).windows(5, 40)
    b = data.PackedWindows(torch.from_numpy(ids.astype(np.int64)), 16, seed=3)
    assert a.dtype == torch.int64 and torch.equal(a, b.windows(5, 40))


def test_every_new_setting_is_checked_when_the_config_is_made(tmp_path):
    (tmp_path / "a.txt").write_text("text")
    cases = {
        "no such file or folder": dict(data=str(tmp_path / "missing")),
        "holds no .txt, .md, .text, .jsonl, .parquet file": dict(
            data=str(tmp_path / "e")
        ),
        "data_config and data_files are for a hub dataset": dict(
            data=str(tmp_path / "a.txt"), data_config="x"
        ),
        "val_fraction must lie in (0, 0.5]": dict(
            data=str(tmp_path / "a.txt"), val_fraction=0.9
        ),
        "bpe:8192 has 8192 tokens; the tiny model's vocab_size is 4096": dict(
            data=str(tmp_path / "a.txt"), tokenizer="bpe:8192"
        ),
        "expected bpe:N": dict(data=str(tmp_path / "a.txt"), tokenizer="bpe:12"),
        "is for data of your own: give data too": dict(tokenizer="bpe:512"),
        "comes with its own tokenizer": dict(init="smollm2", tokenizer="bpe:512"),
        "model_overrides (--set) cannot change it": dict(
            init="smollm2", model_overrides={"num_hidden_layers": 1}
        ),
        "init must be smollm2, a model folder or a .gguf file": dict(init="nope"),
    }
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "notes.csv").write_text("x")
    for says, bad in cases.items():
        with pytest.raises(ValueError) as e:
            TrainConfig(out_dir=str(tmp_path / "r"), **bad)
        assert says in str(e.value) and "\n" not in str(e.value), (bad, str(e.value))
    assert not (tmp_path / "r").exists()


def test_a_failed_tokenization_leaves_nothing_and_a_fixed_source_then_works(tmp_path):
    """A bad file met midway removes the half-written shards (left there, the next
    run would find files without a manifest)."""
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("\n\n".join(plays(2)), encoding="utf-8")
    (tmp_path / "texts" / "b.txt").write_bytes(b"\0binary")
    cfg = config(tmp_path, tmp_path / "texts", tokenizer="shakespeare")
    folder = tmp_path / "s"
    with pytest.raises(ValueError, match="b.txt is a binary file"):
        shards.prepare(cfg, folder, "shakespeare", None, 4096)
    assert list(folder.iterdir()) == []
    (tmp_path / "texts" / "b.txt").write_text("Now text.")
    manifest, reused = shards.prepare(cfg, folder, "shakespeare", None, 4096)
    assert not reused and manifest["splits"]["train"]["tokens"] > 0


def test_a_folder_with_files_of_the_same_names_but_no_manifest_is_not_written(
    tmp_path,
):
    (tmp_path / "a.txt").write_text("\n\n".join(plays(2)), encoding="utf-8")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "train.bin").write_bytes(b"the user's own file")
    cfg = config(tmp_path, tmp_path / "a.txt", tokenizer="shakespeare")
    with pytest.raises(ValueError) as e:
        shards.prepare(cfg, folder, "shakespeare", None, 4096)
    assert str(e.value).startswith(f"{folder} holds train.bin but no manifest.json")
    assert (folder / "train.bin").read_bytes() == b"the user's own file"
    assert sorted(p.name for p in folder.iterdir()) == ["train.bin"]
