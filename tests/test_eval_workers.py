"""`smol eval --workers N`: the scoring done by worker processes, the same scores as
one process's, and an interruption that keeps what they scored and leaves none of
them running."""

import csv
import multiprocessing
import time

import pytest
import torch

from smol import SmolLM, evaluate
from smol.commands import eval as eval_cli
from smol.commands import eval_partial, eval_workers
from tests.tiny_models import with_real_vocab


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer):
    """A tiny model with SmolLM2's vocabulary, saved as a model folder: the workers
    load it as the command does."""
    from smol.pretrained import save_pretrained

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("workers") / "model"
    return save_pretrained(SmolLM(with_real_vocab(2048)), tokenizer, path)


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_workers_score_every_batch_and_give_one_processs_scores(
    folder, tmp_path, monkeypatch, threads
):
    """2 workers of 1 thread each against 1 process of 1 thread: the same rows, to
    the last digit (the same batches, the same kernels). The command's own process
    scores nothing (switch-off: KeptScores ignoring its workers and scoring here,
    which gives the same rows) and more than one worker scored."""
    common = ["--model", str(folder), "--limit", "40", "--token-budget", "600"]
    one = tmp_path / "one"
    assert (
        eval_cli.main(["arc-easy", *common, "--threads", "1", "--out", str(one)]) == 0
    )
    seen = []
    real_init = eval_partial.KeptScores.__init__

    def init(self, workers=None):
        real_init(self, workers)
        seen.append(self)

    monkeypatch.setattr(eval_partial.KeptScores, "__init__", init)

    def here(*args):
        raise AssertionError("the command's process scored a batch")

    monkeypatch.setattr(evaluate, "choice_logprobs", here)
    two = tmp_path / "two"
    argv = ["arc-easy", *common, "--threads", "2", "--workers", "2", "--out", str(two)]
    assert eval_cli.main(argv) == 0
    assert _rows(two / "arc-easy_questions.csv") == _rows(
        one / "arc-easy_questions.csv"
    )
    (kept,) = seen
    assert len(kept.workers.pids) == 2
    assert multiprocessing.current_process().pid not in kept.workers.pids


def test_an_interrupted_run_with_workers_keeps_what_they_scored_and_stops_them(
    folder, tmp_path, capsys, monkeypatch, threads
):
    """Ctrl-C after the third batch back: the questions scored so far are in the
    partial file, as a whole run writes them; the batches not begun are cancelled
    (the command returns in seconds, not after the rest of the run) and no worker is
    left running."""
    common = ["--model", str(folder), "--limit", "200", "--token-budget", "300"]
    whole = tmp_path / "whole"
    assert eval_cli.main(["hellaswag", *common, "--out", str(whole)]) == 0
    rows = {r["index"]: r for r in _rows(whole / "hellaswag_questions.csv")}
    capsys.readouterr()
    real = eval_partial.KeptScores._scored
    stopped = []

    def stopping(self, *args):
        for n, got in enumerate(real(self, *args), 1):
            yield got
            if n == 3:
                stopped.append(time.perf_counter())
                raise KeyboardInterrupt

    monkeypatch.setattr(eval_partial.KeptScores, "_scored", stopping)
    futures = []
    submit = eval_workers.ProcessPoolExecutor.submit

    def submitted(self, *args):
        futures.append(submit(self, *args))
        return futures[-1]

    monkeypatch.setattr(eval_workers.ProcessPoolExecutor, "submit", submitted)
    out = tmp_path / "stopped"
    argv = ["hellaswag", *common, "--workers", "2", "--threads", "2", "--out", str(out)]
    assert eval_cli.main(argv) == 130
    assert time.perf_counter() - stopped[0] < 10
    assert not multiprocessing.active_children()
    # switch-off: shutting down without cancelling scores every batch first
    assert len(futures) > 10 and sum(f.cancelled() for f in futures) > 5
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "hellaswag questions scored so far are in" in last
    kept = _rows(out / "hellaswag_questions.partial.csv")
    assert 0 < len(kept) < 200
    assert all(rows[r["index"]] == r for r in kept)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--workers", "0"], "--workers must be >= 1, got 0"),
        (["--workers", "3", "--threads", "2"], "--workers 3 is more than the 2 CPU"),
        (["--workers", "2"], "--workers 2 splits a CPU's threads; on cuda one"),
    ],
)
def test_workers_that_cannot_work_are_refused_in_one_line(
    argv, says, capsys, monkeypatch
):
    """Refused: no worker, more workers than threads, workers on a GPU (here one
    that torch says is there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: "cuda" in says)
    assert eval_cli.main(["piqa", "--limit", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def _start(folder, *more):
    """`smol eval hellaswag` with 2 workers, in a session of its own; returns the
    process and a function that gives its stderr so far."""
    import subprocess
    import sys
    import threading

    argv = [sys.executable, "-m", "smol", "eval", "hellaswag", "--model", str(folder)]
    argv += ["--workers", "2", "--threads", "2", "--token-budget", "300", *more]
    p = subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    err = []
    threading.Thread(
        target=lambda: err.extend(iter(lambda: p.stderr.read(1), "")), daemon=True
    ).start()
    return p, lambda: "".join(err)


def _when(condition, seconds=60.0):
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    from pathlib import Path

    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()]


def _command(pid: int) -> str:
    from pathlib import Path

    return Path(f"/proc/{pid}/cmdline").read_text()


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:  # a zombie has ended: its parent has not read its status yet
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="/proc")
def test_ctrl_c_to_the_group_is_one_line_and_a_killed_command_takes_its_workers(
    folder, tmp_path
):
    """Ctrl-C in a terminal reaches every process of the group: the command says in
    one line what it kept, and the workers ignore it and SIGTERM, as /proc shows
    (switch-off: workers that take them, which a run stopped mid-batch does not
    show, as the worker's interruption comes back as that batch's). Killed outright (SIGKILL), the
    command's workers exit too (switch-off: no watch on the parent; they wait on
    their queue for ever)."""
    import os
    import re
    import signal
    from pathlib import Path

    p, err = _start(folder, "--limit", "3000", "--out", str(tmp_path / "a"))
    _when(lambda: re.search(r"\| [1-9]\d*/3000", err()))
    os.killpg(p.pid, signal.SIGINT)
    assert p.wait(timeout=60) == 130
    _when(lambda: err().endswith("\n"))
    tail = err().rsplit("smol eval: interrupted", 1)[1]
    assert tail.count("\n") == 1 and "questions scored so far are in" in tail
    assert "Traceback" not in err()
    p, err = _start(folder, "--limit", "3000")
    _when(lambda: re.search(r"\| [1-9]\d*/3000", err()))
    workers = [c for c in _children(p.pid) if "spawn_main" in _command(c)]
    assert len(workers) == 2
    for pid in workers:  # each ignores both signals (/proc's mask of them)
        status = Path(f"/proc/{pid}/status").read_text()
        ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", status)[1], 16)
        assert (
            ignored >> (signal.SIGINT - 1) & 1 and ignored >> (signal.SIGTERM - 1) & 1
        )
    p.kill()
    p.wait()
    _when(lambda: not any(map(_alive, workers)), 30)
