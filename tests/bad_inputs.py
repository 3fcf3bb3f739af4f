"""A survey of the commands' answers to bad input: each case runs `smol VERB ...` in
this process on files made in a temporary folder, and is classed

    clear   one line on stderr, the exit status expected, naming what was wrong
    raw     a traceback, another status, or a message that does not name the input
    silent  accepted (exit status 0) where it should have been refused
    lost    a file the user had was changed or deleted

    python -m tests.bad_inputs            # every case (minutes: a case that is
                                          # accepted may load the bundled weights)
    python -m tests.bad_inputs -k export  # the cases whose command line holds K

A case may also bring a fault: Ctrl-C or SIGTERM sent from inside the command while it
works (its expected status 130 or 143, the line that says it stopped naming what was
kept or discarded, the user's file intact and no file left half-written). And a case
may be an awkward input to take rather than refuse (a hand-in nested or in capitals):
accepted, what it must have done is checked, and a student left out counts as lost.

It prints a table (command, input, class, the message's first line) and the totals;
its exit status is 1 when any case is not clear. A case still running after LIMIT
seconds of CPU counts as silent: it went to work on the bad input."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

Argv = list[str] | Callable[[Path], list[str]]
HUGE = str(2**70)  # a seed past 64 bits


@dataclass
class Case:
    verb: str
    argv: Argv  # the arguments after the verb; a function of the files' folder
    expect: int = 2  # the exit status
    says: str = ""  # what the message must name (lower case)
    keep: str | None = None  # a file under the folder that must survive unchanged
    about: str = ""  # the input, for the table (default: the arguments)
    setup: Callable[[Path], None] | None = None  # more files, made in the folder
    fault: Callable[[], contextlib.AbstractContextManager] | None = None  # while run
    here: Callable[[Path], None] | None = None  # files made in the working folder
    gone: str | None = None  # a file under the folder that must not be there after
    check: Callable[[Path], str] | None = None  # accepted: what is wrong after ("")

    def args(self, root: Path) -> list[str]:
        return self.argv(root) if callable(self.argv) else list(self.argv)


@dataclass
class Outcome:
    case: Case
    kind: str
    status: int | None
    message: str
    shown: str = field(default="")


def conversation(q: str = "Hi", a: str = "Hello") -> dict:
    return {
        "messages": [
            {"role": "user", "content": q},
            {"role": "assistant", "content": a},
        ]
    }


PAIR = {"prompt": "Say hi", "chosen": "Hi", "rejected": "Go away"}


def make_files(root: Path) -> None:
    """The inputs the cases name, under root."""
    (root / "empty.jsonl").write_text("", encoding="utf-8")
    (root / "blank.jsonl").write_text("\n\n", encoding="utf-8")
    (root / "latin1.jsonl").write_bytes(b'{"messages": "caf\xe9"}\n')
    (root / "notjson.jsonl").write_text("this is not json\n", encoding="utf-8")
    (root / "list.jsonl").write_text("[1, 2]\n", encoding="utf-8")
    (root / "noreply.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n",
        encoding="utf-8",
    )
    (root / "badrole.jsonl").write_text(
        json.dumps({"messages": [{"role": "wizard", "content": "Hi"}]}) + "\n",
        encoding="utf-8",
    )
    (root / "chat.jsonl").write_text(
        "\n".join(json.dumps(conversation()) for _ in range(4)) + "\n",
        encoding="utf-8",
    )
    (root / "chat_then_junk.jsonl").write_text(
        json.dumps(conversation()) + "\n{oops\n", encoding="utf-8"
    )
    (root / "pairs.jsonl").write_text(
        "\n".join(json.dumps(PAIR) for _ in range(4)) + "\n", encoding="utf-8"
    )
    (root / "norejected.jsonl").write_text(
        json.dumps({"prompt": "Hi", "chosen": "Hello"}) + "\n", encoding="utf-8"
    )
    (root / "pair_numbers.jsonl").write_text(
        json.dumps({"prompt": 1, "chosen": 2, "rejected": 3}) + "\n", encoding="utf-8"
    )
    (root / "folder").mkdir()
    (root / "folder.jsonl").mkdir()
    (root / "file.txt").write_text("a file\n", encoding="utf-8")
    (root / "precious.gguf").write_text("the user's file\n", encoding="utf-8")
    (root / "empty.gguf").write_bytes(b"")
    (root / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 12)
    (root / "dir.gguf").mkdir()
    gpt2 = root / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 32}),
        encoding="utf-8",
    )
    (gpt2 / "model.safetensors").write_bytes(b"")
    badconfig = root / "badconfig"
    badconfig.mkdir()
    (badconfig / "config.json").write_text("{not json", encoding="utf-8")
    # a model folder that holds an earlier run's results
    for name in ("earlier_run", "earlier_eval"):
        (root / name).mkdir()
    (root / "earlier_run" / "model.safetensors").write_text("x", encoding="utf-8")
    (root / "earlier_eval" / "mmlu.csv").write_text("model\nx\n", encoding="utf-8")
    train = root / "train_run"
    train.mkdir()
    (train / "summary.json").write_text("{}", encoding="utf-8")
    (train / "step_00000010").mkdir()
    # eval compare: runs' question files, well made and hand-edited
    header = "question,subject,answer,correct,correct normalised\n"
    good = root / "run_a"
    good.mkdir()
    (good / "mmlu_questions.csv").write_text(
        header + "0,x,A,1,1\n1,x,B,0,1\n", encoding="utf-8"
    )
    for name, text in {
        "run_badnumber": header + "zero,x,A,1,1\n",
        "run_nocolumn": "question,subject\n0,x\n",
        "run_empty": "",
        "run_header": header,
        "run_verdict": header + "0,x,A,yes,1\n",
    }.items():
        (root / name).mkdir()
        (root / name / "mmlu_questions.csv").write_text(text, encoding="utf-8")
    (root / "run_latin1").mkdir()
    (root / "run_latin1" / "mmlu_questions.csv").write_bytes(
        header.encode() + b"0,caf\xe9,A,1,1\n"
    )
    # grade
    (root / "notebooks").mkdir()
    (root / "notebooks" / "broken.ipynb").write_text("{not json", encoding="utf-8")
    (root / "text.ipynb").write_text("not a notebook", encoding="utf-8")
    (root / "grades.csv").write_text(
        "student,exercise,task\nalice,1\nbob,oops,extra,columns,here\n",
        encoding="utf-8",
    )
    (root / "class").mkdir()
    (root / "class" / "alice").mkdir()
    (root / "class" / "alice" / "01_rmsnorm.ipynb").write_text(
        json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}),
        encoding="utf-8",
    )
    from tests.bad_inputs_data import make_data_files
    from tests.bad_inputs_fresh import make_fresh_files

    make_fresh_files(root)
    make_data_files(root)


def dpo_argv(*more: str) -> Argv:
    """`--data FOLDER/pairs.jsonl --out FOLDER/o` and `more`: a DPO run's arguments."""
    return lambda r: ["--data", str(r / "pairs.jsonl"), "--out", str(r / "o"), *more]


def compare_csv(path: str, says: str, **kw) -> Case:
    """`smol eval compare run_a run_a --csv PATH` (PATH under the files' folder, or
    absolute), a table the command must refuse to write before any work (exit 2),
    naming `says`."""
    return Case(
        "eval",
        lambda r: [
            "compare",
            str(r / "run_a"),
            str(r / "run_a"),
            "--csv",
            str(r / path),
        ],
        2,
        says,
        **kw,
    )


def refused(verb: str, argv: Callable[..., Argv], *rows: str) -> list[Case]:
    """A case of `verb` refused with status 2 for each row "ARGS -> SAYS": ARGS, split
    as a shell would, go to `argv`; SAYS is what the message must name."""
    cases = []
    for row in rows:
        args, says = row.rsplit(" -> ", 1)
        cases.append(Case(verb, argv(*shlex.split(args)), 2, says))
    return cases


def tuning_cases(verb: str, data: str) -> list[Case]:
    """What finetune and dpo share."""

    def d(*more: str) -> Argv:
        return lambda r: ["--data", str(r / data), "--out", str(r / "out"), *more]

    def not_a_model(folder: str, says: str, out: str = "o") -> Case:
        """--model naming a folder of the files' that holds no model smol loads."""
        return Case(
            verb,
            lambda r: (
                ["--data", str(r / data), "--out", str(r / out), "--model"]
                + [str(r / folder)]
            ),
            1,
            says,
        )

    return [
        Case(verb, lambda r: ["--data", str(r / "missing.jsonl")], 1, "missing.jsonl"),
        Case(verb, lambda r: ["--data", str(r / "folder")], 1, "folder"),
        Case(verb, lambda r: ["--data", str(r / "empty.jsonl")], 1, "empty.jsonl"),
        Case(verb, lambda r: ["--data", str(r / "blank.jsonl")], 1, "blank.jsonl"),
        Case(verb, lambda r: ["--data", str(r / "latin1.jsonl")], 1, "latin1.jsonl"),
        Case(verb, lambda r: ["--data", str(r / "notjson.jsonl")], 1, "notjson.jsonl"),
        Case(verb, lambda r: ["--data", str(r / "list.jsonl")], 1, "list.jsonl"),
        Case(
            verb,
            lambda r: ["--data", str(r / data), "--val-data", str(r / "nope.jsonl")],
            1,
            "nope.jsonl",
        ),
        Case(verb, ["--data", ""], 2, "--data"),
        *refused(
            verb,
            d,
            "--lora-targets '' -> target",
            "--lora-targets q_proj,bogus -> bogus",
            "--lora-targets q_proj,,v_proj -> target",
            "--lora-r -1 -> --lora-r",
            "--lora-r 0 --lora-alpha 16 -> --lora-alpha",
            "--lora-alpha nan -> alpha",
            "--lora-alpha -4 -> alpha",
            "--lora-dropout 1.5 -> dropout",
            "--lora-dropout nan -> dropout",
            "--steps 0 -> steps",
            "--batch-size -2 -> batch_size",
            "--max-len 0 -> seq_len",
            "--lr nan -> lr",
            "--lr inf -> lr",
            "--weight-decay -1 -> weight_decay",
            "--warmup-steps -1 -> warmup",
            f"--seed {HUGE} -> seed",
            "--seed -1 -> seed",
            "--dtype fp64 -> dtype",
            "--device tpu -> device",
            "--resume --overwrite -> overwrite",
        ),
        Case(verb, lambda r: ["--data", str(r / data), "--out", ""], 2, "--out"),
        Case(
            verb,
            lambda r: ["--data", str(r / data), "--out", str(r / "file.txt")],
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(
            verb,
            lambda r: ["--data", str(r / data), "--out", str(r / "earlier_run")],
            2,
            "earlier_run",
            keep="earlier_run/model.safetensors",
        ),
        Case(
            verb,
            lambda r: [
                "--data",
                str(r / data),
                "--model",
                str(r / "earlier_run"),
                "--out",
                str(r / "earlier_run"),
            ],
            2,
            "--out",
            keep="earlier_run/model.safetensors",
        ),
        Case(verb, d("--model", ""), 2, "--model"),
        Case(verb, d("--resume"), 1, "resume", about="--resume with nothing to resume"),
        not_a_model("missing_model", "missing_model", out="out"),
        not_a_model("gpt2", "gpt2"),
        not_a_model("badconfig", "config.json"),
    ]


def stop_at(module: str, name: str, n: int, signum: int | None = None):
    """A fault: module.name's n-th call sends signum (None: raises Ctrl-C's
    KeyboardInterrupt) before it runs, as a user or a scheduler would midway."""

    @contextlib.contextmanager
    def fault():
        mod = importlib.import_module(module)
        real, calls = getattr(mod, name), []

        def stopping(*args, **kwargs):
            calls.append(1)
            if len(calls) == n:
                if signum is None:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signum)
            return real(*args, **kwargs)

        setattr(mod, name, stopping)
        try:
            yield
        finally:
            setattr(mod, name, real)

    return fault


def earlier_gradebook(change: str) -> Callable[[Path], None]:
    """book.csv and its class report book.json from an earlier run over class/, then
    `change`: "hand" (a regrade typed into the gradebook), "other" (the report is
    another class's) or "unrecorded" (no report records the gradebook)."""

    def setup(root: Path) -> None:
        from smol.grading.gradebook import csv_text

        book = root / "book.csv"
        book.write_text(csv_text([["alice", "01_rmsnorm", "rms", 3, 4, "graded"]]))
        written = {
            "submissions": str((root / "class").resolve()),
            "gradebook": hashlib.sha256(book.read_bytes()).hexdigest(),
            "feedback": {},
        }
        if change == "other":
            written["submissions"] = "/courses/another/submissions"
        if change == "hand":
            book.write_text(book.read_text().replace(",3,4,", ",4,4,"))
        report = {"score": 3, "total": 4, "notebooks": [], "written": written}
        if change != "unrecorded":
            (root / "book.json").write_text(json.dumps(report), encoding="utf-8")

    return setup


def hand_ins(root: Path) -> None:
    """class2/: ada's notebook nested in a folder of her hand-in, ending in .IPYNB;
    and book.json, the report of the last run, in which bob handed one in that he
    has since deleted."""
    folder = root / "class2" / "ada" / "hw2"
    folder.mkdir(parents=True)
    empty = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / "01_rmsnorm.IPYNB").write_text(json.dumps(empty), encoding="utf-8")
    bob = {"student": "bob", "exercise": "01_rmsnorm", "sha256": "x", "tasks": []}
    bob["tasks"] = [{"task": "rms", "score": 4, "total": 4, "graded": True}]
    written = {"submissions": str((root / "class2").resolve()), "feedback": {}}
    report = {"score": 4, "total": 4, "notebooks": [bob], "written": written}
    (root / "book.json").write_text(json.dumps(report), encoding="utf-8")


def every_student_in_the_gradebook(root: Path) -> str:
    """What book.csv lacks: ada's graded rows, bob's rows marked missing."""
    import csv

    with open(root / "book.csv", encoding="utf-8") as f:
        rows = {(r["student"], r["status"].split(":")[0]) for r in csv.DictReader(f)}
    lacking = [
        f"{who} ({what})"
        for who, what in (("ada", "not graded"), ("bob", "missing"))
        if (who, what) not in rows
    ]
    return "book.csv lacks " + ", ".join(lacking) if lacking else ""


def cases() -> list[Case]:
    g, c = "generate", "chat"

    def hi(*more: str) -> list[str]:
        return ["hi", *more]

    out: list[Case] = [
        Case(g, [""], 2, "prompt"),
        *refused(
            g,
            hi,
            "--max-new-tokens 0 -> --max-new-tokens",
            "--max-new-tokens -5 -> --max-new-tokens",
            "--max-new-tokens ten -> --max-new-tokens",
            f"--max-new-tokens {HUGE} -> --max-new-tokens",
            "--temperature nan -> --temperature",
            "--temperature inf -> --temperature",
            "--temperature -1 -> --temperature",
            "--temperature 1e-320 -> --temperature",
            "--top-k 0 -> --top-k",
            "--top-p 0 -> --top-p",
            "--top-p 1.5 -> --top-p",
            "--top-p nan -> --top-p",
            f"--seed {HUGE} -> --seed",
            "--seed -1 -> --seed",
            "--speculative -1 -> --speculative",
            "--speculative 4 --temperature 0.7 -> --temp",
            "--speculative 4 --compile -> --compile",
            "--draft int4 -> --draft",
            "--quantize int8 --dtype float16 -> --quantize",
            "--dtype float64 -> --dtype",
            "--device tpu -> --device",
            "--threads 0 -> --threads",
            "--bogus -> --bogus",
            "--source '' -> --source",
        ),
        Case(g, lambda r: ["hi", "--source", str(r / "missing.gguf")], 1, "missing"),
        Case(g, lambda r: ["hi", "--source", str(r / "empty.gguf")], 1, "empty.gguf"),
        Case(g, lambda r: ["hi", "--source", str(r / "junk.gguf")], 1, "junk.gguf"),
        Case(g, lambda r: ["hi", "--source", str(r / "dir.gguf")], 1, "dir.gguf"),
        Case(g, lambda r: ["hi", "--source", str(r / "folder")], 1, "folder"),
        Case(g, lambda r: ["hi", "--source", str(r / "file.txt")], 1, "file.txt"),
        Case(g, lambda r: ["hi", "--source", str(r / "gpt2")], 1, "gpt2"),
        Case(g, lambda r: ["hi", "--source", str(r / "badconfig")], 1, "config.json"),
        Case(c, ["   "], 2, "message"),
        Case(c, ["hi", "--system", ""], 2, "--system"),
        Case(c, ["--speculative", "2"], 2, "--speculative"),
        *refused(
            c,
            hi,
            "--max-new-tokens 0 -> --max-new-tokens",
            "--top-p 2 -> --top-p",
            f"--seed {HUGE} -> --seed",
        ),
    ]
    t = "train"

    def o(*more: str) -> Argv:
        return lambda r: ["--out-dir", str(r / "run"), *more]

    out += [
        *refused(
            t,
            o,
            "--steps 0 -> steps",
            "--steps 1e3 -> --steps",
            "--lr nan -> lr",
            "--lr -1 -> lr",
            "--batch-size 0 -> batch_size",
            "--grad-accum 0 -> grad_accum",
            "--seq-len 100000 -> seq_len",
            "--preset huge -> preset",
            "--set bogus=1 -> bogus",
            "--set num_hidden_layers=two -> num_hidden_layers",
            "--set num_hidden_layers=0 -> num_hidden_layers",
            "--set num_hidden_layers -> num_hidden_layers",
            "--set rms_norm_eps=nan -> rms_norm_eps",
            f"--seed {HUGE} -> seed",
            "--dtype fp8 -> dtype",
            "--device tpu -> device",
            "--schedule linear -> schedule",
            "--beta2 1 -> beta2",
            "--sample-prompt '' -> sample_prompt",
            "--sample-tokens -1 -> sample_tokens",
            "--resume --overwrite -> overwrite",
        ),
        Case(t, ["--out-dir", ""], 2, "out_dir"),
        Case(
            t,
            lambda r: ["--out-dir", str(r / "file.txt"), "--warmup-steps", "0"],
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(
            t,
            lambda r: ["--out-dir", str(r / "train_run"), "--warmup-steps", "0"],
            2,
            "train_run",
            keep="train_run/summary.json",
        ),
        Case(
            t,
            lambda r: ["--out-dir", str(r / "run"), "--resume", str(r / "nowhere")],
            1,
            "nowhere",
        ),
    ]
    out += tuning_cases("finetune", "chat.jsonl")
    out += [
        Case("finetune", lambda r, f=f: ["--data", str(r / f)], 1, f)
        for f in ("noreply.jsonl", "badrole.jsonl", "chat_then_junk.jsonl")
    ]
    dpo = tuning_cases("dpo", "pairs.jsonl")
    out += [case for case in dpo if "lora" not in " ".join(case.args(Path("/r")))]

    p = dpo_argv

    out += [
        Case("dpo", lambda r, f=f: ["--data", str(r / f)], 1, f)
        for f in ("norejected.jsonl", "pair_numbers.jsonl", "chat.jsonl")
    ]
    out += [
        Case("dpo", p("--beta", "0"), 2, "--beta"),
        Case("dpo", p("--beta", "nan"), 2, "--beta"),
        Case("dpo", p("--beta", "-1"), 2, "--beta"),
        Case("dpo", lambda r: p("--reference", str(r / "o"))(r), 2, "reference model"),
        Case("dpo", lambda r: p("--reference", str(r / "gone"))(r), 1, "gone"),
        Case("dpo", p("--reference", ""), 2, "--reference"),
    ]

    def q(*more: str) -> Argv:
        return lambda r: ["--task", "add", "--out", str(r / "o"), *more]

    out += [
        Case("grpo", lambda r: ["--task", "bogus", "--out", str(r / "o")], 2, "bogus"),
        Case("grpo", lambda r: ["--task", "", "--out", str(r / "o")], 2, "--task"),
        Case("grpo", ["--out", "x"], 2, "--task"),
        Case("grpo", q("--group-size", "1"), 2, "--group-size"),
        Case("grpo", q("--epsilon", "0"), 2, "--epsilon"),
        Case("grpo", q("--epsilon", "nan"), 2, "--epsilon"),
        Case("grpo", q("--epsilon-high", "-0.1"), 2, "--epsilon-high"),
        Case("grpo", q("--temperature", "0"), 2, "--temperature"),
        Case("grpo", q("--temperature", "1e-320"), 2, "--temperature"),
        Case("grpo", q("--loss-type", "bogus"), 2, "bogus"),
        Case("grpo", q("--max-new-tokens", "0"), 2, "--max-new-tokens"),
        Case("grpo", q("--beta", "-1"), 2, "--beta"),
        Case("grpo", q("--format-weight", "inf"), 2, "--format-weight"),
        Case("grpo", q("--lora-targets", ""), 2, "target"),
        Case("grpo", q("--seed", HUGE), 2, "seed"),
        Case(
            "grpo",
            lambda r: q("--out", str(r / "earlier_run"))(r),
            2,
            "earlier_run",
            keep="earlier_run/model.safetensors",
        ),
    ]
    e = "eval"

    def m(*more: str) -> Argv:
        return ["mmlu", *more]

    out += [
        Case(e, ["bogus"], 2, "bogus"),
        Case(e, [], 2, "task"),
        *refused(
            e,
            m,
            "--limit 0 -> --limit",
            "--limit -3 -> --limit",
            "--shots -1 -> --shots",
            "--shots 1000 -> --shots",
            "--token-budget 0 -> --token-budget",
            "--threads 0 -> --threads",
            "--dtype float16 -> --dtype",
            "--device tpu -> --device",
            "--model '' -> --model",
        ),
        Case(e, lambda r: m("--model", str(r / "nowhere")), 2, "nowhere"),
        Case(e, lambda r: m("--model", str(r / "gpt2"), "--limit", "1"), 1, "gpt2"),
        Case(e, lambda r: m("--model", str(r / "empty.gguf")), 1, "empty.gguf"),
        Case(
            e, lambda r: m("--out", str(r / "file.txt")), 2, "file.txt", keep="file.txt"
        ),
        Case(
            e,
            lambda r: m("--out", str(r / "earlier_eval")),
            2,
            "earlier_eval",
            keep="earlier_eval/mmlu.csv",
        ),
        Case(e, ["hellaswag", "--limit", "0"], 2, "--limit"),
        Case(
            e,
            lambda r: m("--limit", "57", "--out", str(r / "results")),
            130,
            "mmlu_questions.partial.csv",
            about="mmlu --limit 57 --out DIR, Ctrl-C in its 2nd batch",
            fault=stop_at("smol.evaluate", "choice_logprobs", 2),
            gone="results/mmlu_questions.csv",
        ),
        Case(
            e,
            m("--limit", "57"),
            143,
            "discarded",
            about="mmlu --limit 57, SIGTERM in its 2nd batch",
            fault=stop_at("smol.evaluate", "choice_logprobs", 2, signal.SIGTERM),
        ),
        Case(
            e,
            lambda r: ["piqa", "--limit", "40", "--out", str(r / "results")],
            143,
            "piqa_questions.partial.csv",
            about="piqa --limit 40 --out DIR, SIGTERM in its 2nd batch",
            fault=stop_at("smol.evaluate", "choice_logprobs", 2, signal.SIGTERM),
            gone="results/piqa_questions.csv",
        ),
        Case(
            e, lambda r: ["compare", str(r / "nowhere"), str(r / "run_a")], 2, "nowhere"
        ),
    ]
    for name in ("badnumber", "nocolumn", "empty", "header", "verdict", "latin1"):
        out.append(
            Case(
                e,
                lambda r, n=name: ["compare", str(r / f"run_{n}"), str(r / "run_a")],
                1,
                f"run_{name}",
            )
        )
    out += [
        compare_csv("folder", "folder"),
        compare_csv("precious.gguf", "precious.gguf", keep="precious.gguf"),
    ]
    x = "export"
    out += [
        Case(x, ["smollm2", "out.bin"], 2, ".gguf"),
        Case(
            x,
            lambda r: ["smollm2", str(r / "precious.gguf")],
            2,
            "precious.gguf",
            keep="precious.gguf",
        ),
        Case(x, lambda r: ["smollm2", str(r / "no" / "where.gguf")], 2, "no"),
        Case(x, lambda r: ["smollm2", str(r / "dir.gguf")], 2, "dir.gguf"),
        Case(
            x,
            lambda r: ["smollm2", str(r / "dir.gguf"), "--overwrite"],
            2,
            "dir.gguf",
        ),
        Case(x, lambda r: [str(r / "junk.gguf"), str(r / "junk.gguf")], 2, "model"),
        Case(x, ["smollm2", "o.gguf", "--type", "q4_k"], 2, "--type"),
        Case(x, ["smollm2", "o.gguf", "--name", ""], 2, "--name"),
        Case(x, ["", "o.gguf"], 2, "model"),
        Case(x, lambda r: [str(r / "nowhere"), str(r / "o.gguf")], 2, "nowhere"),
        Case(x, lambda r: [str(r / "gpt2"), str(r / "o.gguf")], 1, "gpt2"),
        Case(x, lambda r: [str(r / "folder"), str(r / "o.gguf")], 1, "folder"),
        Case(x, lambda r: [str(r / "empty.gguf"), str(r / "o.gguf")], 1, "empty.gguf"),
        Case(x, lambda r: [str(r / "junk.gguf"), str(r / "o.gguf")], 1, "junk.gguf"),
        Case(x, lambda r: [str(r / "file.txt"), str(r / "o.gguf")], 1, "file.txt"),
        Case(x, lambda r: [str(r / "badconfig"), str(r / "o.gguf")], 1, "config.json"),
        Case(
            x,
            lambda r: ["smollm2", str(r / "precious.gguf"), "--overwrite"],
            143,
            "precious.gguf was not written (the earlier file is as it was)",
            keep="precious.gguf",
            about="smollm2 $TMP/precious.gguf --overwrite, SIGTERM while writing",
            fault=stop_at("smol.export", "pack_tensor_info", 3, signal.SIGTERM),
        ),
        Case(
            x,
            lambda r: ["smollm2", str(r / "fresh.gguf")],
            130,
            "fresh.gguf was not written",
            about="smollm2 $TMP/fresh.gguf, Ctrl-C while writing",
            fault=stop_at("smol.export", "pack_tensor_info", 3),
            gone="fresh.gguf",
        ),
    ]
    gr = "grade"
    out += [
        Case(gr, lambda r: [str(r / "nowhere")], 2, "nowhere"),
        Case(gr, lambda r: [str(r / "folder")], 2, "folder"),
        Case(gr, lambda r: [str(r / "file.txt")], 2, "file.txt"),
        Case(gr, lambda r: [str(r / "folder"), "--timeout", "0"], 2, "--timeout"),
        Case(gr, lambda r: [str(r / "folder"), "--timeout", "nan"], 2, "--timeout"),
        Case(gr, lambda r: [str(r / "folder"), "--check-timeout", "-1"], 2, "timeout"),
        Case(gr, lambda r: [str(r / "folder"), "--jobs", "0"], 2, "--jobs"),
        Case(
            gr,
            lambda r: [str(r / "class"), "--feedback", str(r / "fb")],
            2,
            "--feedback",
        ),
        Case(
            gr,
            lambda r: (
                [str(r / "class"), str(r / "folder"), "--gradebook"]
                + [str(r / "g.csv")]
            ),
            2,
            "--gradebook",
        ),
        *(  # a file that gradebook or json would write, left as it was
            Case(gr, lambda r, a=a, f=f, k=k: [str(r / a), f, str(r / k)], s, k, keep=k)
            for a, f, k, s in (
                ("class", "--gradebook", "grades.csv", 2),
                ("class", "--gradebook", "file.txt", 2),
                ("notebooks", "--json", "precious.gguf", 2),
            )
        ),
        Case(
            gr,
            lambda r: [str(r / "notebooks"), "--json", str(r / "no" / "r.json")],
            2,
            "no",
        ),
        Case(
            gr,
            lambda r: [str(r / "notebooks"), "--tasks", "no_such_module"],
            2,
            "no_such",
        ),
        Case(gr, lambda r: [str(r / "text.ipynb"), "--json", "-"], 1, "text.ipynb"),
        *(
            Case(
                gr,
                lambda r: [str(r / "class"), "--gradebook", str(r / "book.csv")],
                2,
                says,
                keep="book.csv",
                about=f"$TMP/class --gradebook $TMP/book.csv ({about})",
                setup=earlier_gradebook(change),
            )
            for change, says, about in (
                ("hand", "book.csv was changed", "regraded by hand since"),
                ("other", "another class", "its report another class's"),
                ("unrecorded", "book.csv was not written", "no report records it"),
            )
        ),
        Case(
            gr,
            lambda r: (
                [str(r / "class2"), "--gradebook", str(r / "book.csv")]
                + ["--jobs", "1"]
            ),
            0,
            about="$TMP/class2 --gradebook $TMP/book.csv (ada's notebook in a "
            "subfolder, ending in .IPYNB; bob's deleted since the last run)",
            setup=hand_ins,
            check=every_student_in_the_gradebook,
        ),
    ]
    from tests.bad_inputs_data import data_cases
    from tests.bad_inputs_fresh import fresh_cases

    return out + fresh_cases() + data_cases()


# CPU seconds: a case still running by then went to work on the bad input. CPU time,
# not the clock's, so that a busy machine (which gives a case less of the CPU each
# second) classes no case otherwise; the clock's WAIT ends a case that waits instead.
LIMIT, WAIT = 30, 600


class TooLong(BaseException):
    """A case still running after LIMIT seconds of CPU (or WAIT of the clock)."""


def _too_long(signum, frame):
    raise TooLong


def run_case(case: Case, root: Path) -> Outcome:
    from smol.commands import main

    argv = [case.verb, *case.args(root)]
    if case.setup is not None:
        case.setup(root)
    before = _snapshot(root, case.keep)
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    work = Path(tempfile.mkdtemp(dir=root))
    try:
        os.chdir(work)
        if case.here is not None:
            case.here(work)
        timers = {
            signal.SIGPROF: signal.ITIMER_PROF,
            signal.SIGALRM: signal.ITIMER_REAL,
        }
        previous = {s: signal.signal(s, _too_long) for s in timers}
        signal.setitimer(signal.ITIMER_PROF, LIMIT)  # this process's CPU time
        signal.setitimer(signal.ITIMER_REAL, WAIT)
        try:
            fault = case.fault() if case.fault else contextlib.nullcontext()
            with (
                contextlib.redirect_stderr(err),
                contextlib.redirect_stdout(out),
                fault,
            ):
                status = main(argv)
        finally:
            for signum, timer in timers.items():
                signal.setitimer(timer, 0)
                signal.signal(signum, previous[signum])
    except TooLong:
        return Outcome(case, "silent", None, f"still working after {LIMIT} s of CPU")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001 (what escapes is the finding)
        tb = traceback.format_exception_only(type(e), e)[-1].strip()
        return Outcome(case, "raw", None, f"traceback: {tb}")
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    errors = [line for line in err.getvalue().splitlines() if ": error: " in line]
    message = errors[0].split(": error: ", 1)[1] if errors else ""
    last = (err.getvalue().strip().splitlines() or [""])[-1]
    shown = message or last
    if case.keep is not None and _snapshot(root, case.keep) != before:
        return Outcome(case, "lost", status, shown)
    if case.gone is not None and (root / case.gone).exists():
        return Outcome(case, "raw", status, f"left {case.gone} behind; {shown}")
    if case.check is not None:  # an input to take, not to refuse
        if status != 0:
            return Outcome(case, "raw", status, shown)
        problem = case.check(root)
        return Outcome(case, "lost" if problem else "clear", status, problem or "done")
    if status == 0:
        return Outcome(case, "silent", status, shown)
    if case.fault is not None:  # the line that says it stopped, and what it kept
        clear = (
            status == case.expect
            and "Traceback" not in err.getvalue()
            and case.says.lower() in last.lower()
        )
        return Outcome(case, "clear" if clear else "raw", status, last)
    clear = (
        status == case.expect
        and len(errors) == 1
        and "Traceback" not in err.getvalue()
        and case.says.lower() in message.lower()
    )
    return Outcome(case, "clear" if clear else "raw", status, shown)


def _snapshot(root: Path, keep: str | None):
    if keep is None:
        return None
    path = root / keep
    return path.read_bytes() if path.is_file() else None


def survey(select: str = "") -> list[Outcome]:
    """Run the cases whose command line holds `select`, each on fresh files."""
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        make_files(base)
        for i, case in enumerate(cases()):
            root = Path(tmp) / f"case{i}"
            shutil.copytree(base, root, symlinks=True)
            text = " ".join([case.verb, *case.args(root)])
            if select and select not in text:
                continue
            outcomes.append(run_case(case, root))
            shutil.rmtree(root, ignore_errors=True)
    return outcomes


def shown_input(case: Case, root: str = "$TMP") -> str:
    if case.about:
        return case.about
    args = case.args(Path(root))
    return " ".join(repr(a) if a == "" or " " in a else a for a in args)


def report(outcomes: list[Outcome]) -> str:
    lines = [f"{'command':<9} {'class':<7} {'status':>6}  input -> message"]
    for o in outcomes:
        status = "-" if o.status is None else str(o.status)
        lines.append(
            f"{o.case.verb:<9} {o.kind:<7} {status:>6}  {shown_input(o.case)}"
            f" -> {o.message[:160]}"
        )
    counts = {k: sum(o.kind == k for o in outcomes) for k in CLASSES}
    total = len(outcomes)
    share = 100 * counts["clear"] / total if total else 0.0
    lines.append(
        f"{total} cases: "
        + ", ".join(f"{n} {k}" for k, n in counts.items())
        + f" ({share:.0f}% clear)"
    )
    return "\n".join(lines)


CLASSES = ("clear", "raw", "silent", "lost")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.bad_inputs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-k", default="", help="only the cases whose command line holds K")
    args = p.parse_args(argv)
    outcomes = survey(args.k)
    print(report(outcomes))
    return 0 if all(o.kind == "clear" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
