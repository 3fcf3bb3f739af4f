"""More cases for tests/bad_inputs.py, a second round over every command: numbers out
of range or of the wrong kind, empty and blank strings, paths of the wrong kind
(missing, a folder for a file, a file for a folder, unwritable, not UTF-8, truncated
or junk), outputs that exist, options that conflict, and Ctrl-C or SIGTERM midway."""

from __future__ import annotations

import json
import shlex
import signal
from collections.abc import Callable
from pathlib import Path

from tests.bad_inputs import (
    HUGE,
    PAIR,
    Argv,
    Case,
    compare_csv,
    conversation,
    dpo_argv,
    refused,
    stop_at,
)

UNWRITABLE = "/sys"  # a folder that even root cannot write into
NOT_UTF8 = "caf\udce9"  # as Python gets the bytes b"caf\xe9" of a command line
LLAMA = {  # a config.json smol reads, of a model too small to matter
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


def make_fresh_files(root: Path) -> None:
    """The inputs only these cases name, under root (next to make_files')."""
    (root / "latin1.ipynb").write_bytes(b'{"cells": "caf\xe9"}')
    (root / "empty.ipynb").write_bytes(b"")
    (root / "dir.ipynb").mkdir()
    (root / "pairs_then_junk.jsonl").write_text(
        json.dumps(PAIR) + '\n{"prompt": "Hi", "cho\n', encoding="utf-8"
    )
    (root / "chat_numbers.jsonl").write_text(
        json.dumps(conversation()).replace('"Hello"', "42") + "\n", encoding="utf-8"
    )
    (root / "chat_empty_object.jsonl").write_text("{}\n", encoding="utf-8")
    (root / "pairs_empty_reply.jsonl").write_text(
        json.dumps({**PAIR, "chosen": ""}) + "\n", encoding="utf-8"
    )
    badweights = root / "badweights"
    badweights.mkdir()
    (badweights / "config.json").write_text(json.dumps(LLAMA), encoding="utf-8")
    (badweights / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{junk}")
    latin1config = root / "latin1config"
    latin1config.mkdir()
    (latin1config / "config.json").write_bytes(b'{"model_type": "caf\xe9"}')
    listconfig = root / "listconfig"
    listconfig.mkdir()
    (listconfig / "config.json").write_text("[1, 2]", encoding="utf-8")
    header = "question,subject,answer,correct,correct normalised\n"
    for name, text in {
        "run_twice": header + "0,x,A,1,1\n0,x,A,0,0\n",
        "run_other": header + "5,x,A,1,1\n6,x,B,0,1\n",
        "run_short": header + "0,x,A,1\n",
        "run_negative": header + "-1,x,A,1,1\n",
    }.items():
        (root / name).mkdir()
        (root / name / "mmlu_questions.csv").write_text(text, encoding="utf-8")
    (root / "latin1.csv").write_bytes(b"caf\xe9,1\n")
    (root / "feedback").mkdir()
    (root / "feedback" / "alice.md").write_text("my own notes\n", encoding="utf-8")
    make_instructor_files(root)


def truncated_gguf(size: int) -> Callable[[Path], None]:
    """A setup: cut.gguf, the bundled GGUF's first `size` bytes (a download cut
    short)."""

    def setup(root: Path) -> None:
        from smol.gguf import bundled_gguf_path

        with open(bundled_gguf_path(), "rb") as f:
            (root / "cut.gguf").write_bytes(f.read(size))

    return setup


def fresh_cases() -> list[Case]:
    out = _generate_cases() + _chat_cases() + _train_cases()
    out += _tuning_cases("finetune", "chat.jsonl") + _tuning_cases("dpo", "pairs.jsonl")
    out += _finetune_dpo_cases() + _grpo_cases() + _eval_cases() + _export_cases()
    return out + _grade_cases() + instructor_cases() + _post_training_cases()


def _hi(*more: str) -> list[str]:
    return ["hi", *more]


def _generate_cases() -> list[Case]:
    g = "generate"

    def source(name: str, says: str = "", **kw) -> Case:
        return Case(g, lambda r: _hi("--source", str(r / name)), 1, says or name, **kw)

    return [
        *refused(
            g,
            _hi,
            "--top-k -3 -> --top-k",
            "--top-k 1.5 -> --top-k",
            "--top-p inf -> --top-p",
            "--top-p -0.5 -> --top-p",
            "--temperature warm -> --temperature",
            "--threads -2 -> --threads",
            "--threads 1.5 -> --threads",
            f"--threads {HUGE} -> --threads",
            f"--speculative {HUGE} -> --speculative",
            "--speculative 2.5 -> --speculative",
            "--draft bfloat16 -> --draft",
            "--speculative 4 --draft bfloat16 --dtype bfloat16 -> --draft",
            "--speculative 4 --draft int4 --quantize int8 -> --draft",
            "--device '' -> --device",
            "--device cuda:x -> --device",
            "--source '   ' -> --source",
            "--max-new-tokens 9000 -> --max-new-tokens",
        ),
        Case(g, ["   "], 2, "prompt", about="'   ' (a blank prompt)"),
        Case(g, [NOT_UTF8], 2, "prompt", about="a prompt not UTF-8"),
        source("latin1.jsonl"),
        source("badweights", "model.safetensors"),
        source("latin1config", "config.json"),
        source("listconfig", "config.json"),
        source(
            "cut.gguf", about="--source a GGUF cut short", setup=truncated_gguf(4096)
        ),
        Case(
            g,
            lambda r: (
                _hi("--speculative", "4", "--draft", "int4", "--device", "cpu")
                + ["--source", str(r / "badweights")]
            ),
            2,
            "--draft int4",
        ),
    ]


def _chat_cases() -> list[Case]:
    c = "chat"
    return [
        *refused(
            c,
            _hi,
            "--max-new-tokens -1 -> --max-new-tokens",
            "--temperature nan -> --temperature",
            "--top-k 0 -> --top-k",
            "--threads 0 -> --threads",
            "--device tpu -> --device",
            "--dtype float64 -> --dtype",
            "--draft int4 -> --draft",
            "--quantize int8 --dtype float16 -> --quantize",
            "--system '   ' -> --system",
            "--source '' -> --source",
        ),
        Case(c, ["--compile"], 2, "--compile", about="--compile (no message)"),
        Case(c, [""], 2, "message"),
        Case(c, [NOT_UTF8], 2, "message", about="a message not UTF-8"),
        Case(
            c, ["hi", "--system", NOT_UTF8], 2, "--system", about="--system not UTF-8"
        ),
        Case(c, lambda r: _hi("--source", str(r / "missing.gguf")), 1, "missing.gguf"),
        Case(c, lambda r: _hi("--source", str(r / "dir.gguf")), 1, "dir.gguf"),
        Case(c, lambda r: _hi("--source", str(r / "junk.gguf")), 1, "junk.gguf"),
    ]


def _train_cases() -> list[Case]:
    t = "train"

    def o(*more: str) -> Argv:
        return lambda r: ["--out-dir", str(r / "run"), *more]

    def stopped(signum: int, status: int) -> Case:
        run = shlex.split("--steps 40 --log-every 1 --eval-every 0 --sample-tokens 0")
        return Case(
            t,
            o(*run),
            status,
            "--resume",
            about=f"--steps 40 --out-dir DIR, {signum.name} at its 3rd step",
            fault=stop_at("smol.train_report", "show_progress", 3, signum),
        )

    return [
        *refused(
            t,
            o,
            "--steps -5 -> steps",
            "--batch-size 1.5 -> --batch-size",
            "--seq-len 0 -> seq_len",
            "--grad-accum -1 -> grad_accum",
            "--lr inf -> lr",
            "--min-lr -1 -> min_lr",
            "--min-lr 1 -> min_lr",
            "--warmup-steps 400 -> warmup_steps",
            "--decay-fraction 1.5 -> decay_fraction",
            "--decay-fraction nan -> decay_fraction",
            "--weight-decay nan -> weight_decay",
            "--beta1 -0.1 -> beta1",
            "--grad-clip inf -> grad_clip",
            "--eval-every -1 -> eval_every",
            "--eval-batches 0 -> eval_batches",
            "--log-every 0 -> log_every",
            "--ckpt-every -1 -> ckpt_every",
            "--keep-checkpoints 0 -> keep_checkpoints",
            "--seed -1 -> seed",
            "--tokenizer bogus -> tokenizer",
            "--device cuda:x -> device",
            "--resume '' -> resume",
            "--set tie_word_embeddings=maybe -> tie_word_embeddings",
            "--set =1 -> --set",
            "--set vocab_size=0 -> vocab_size",
            "--set rope_theta=inf -> rope_theta",
            "--set num_attention_heads=3 -> num_attention_heads",
        ),
        Case(
            t,
            lambda r: ["--out-dir", str(r / "file.txt" / "run")],
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(t, ["--out-dir", f"{UNWRITABLE}/run"], 2, "run"),
        Case(
            t,
            o("--sample-prompt", NOT_UTF8),
            2,
            "sample_prompt",
            about="--out-dir $TMP/run --sample-prompt (not UTF-8)",
        ),
        Case(
            t,
            lambda r: ["--out-dir", str(r / "train_run"), "--resume"],
            1,
            "train_run",
            about="$TMP/train_run --resume (its one checkpoint an empty folder)",
        ),
        stopped(signal.SIGTERM, 143),
        stopped(signal.SIGINT, 130),
    ]


def _tuning_cases(verb: str, data: str) -> list[Case]:
    """What finetune and dpo share, beyond tests/bad_inputs.py's tuning_cases."""

    def d(*more: str) -> Argv:
        return lambda r: ["--data", str(r / data), "--out", str(r / "out"), *more]

    cases = [
        *refused(
            verb,
            d,
            "--steps -1 -> steps",
            "--steps 1.5 -> --steps",
            "--grad-accum 0 -> grad_accum",
            "--max-len -1 -> seq_len",
            "--lr 0 -> lr",
            "--weight-decay nan -> weight_decay",
            "--eval-every -1 -> eval_every",
            "--log-every 0 -> log_every",
            "--ckpt-every -1 -> ckpt_every",
            "--lora-r 1.5 -> --lora-r",
            "--lora-alpha inf -> alpha",
            "--lora-dropout -0.1 -> dropout",
            "--lora-dropout 1 -> dropout",
            "--lora-r 0 --lora-dropout 0.1 -> --lora-dropout",
            "--val-data '' -> --val-data",
            "--dtype bf17 -> dtype",
            "--device cuda:x -> device",
        ),
        Case(
            verb,
            lambda r: d("--val-data", str(r / "folder"))(r),
            1,
            "folder",
        ),
        Case(
            verb,
            lambda r: d("--val-data", str(r / "latin1.jsonl"))(r),
            1,
            "latin1.jsonl",
        ),
        Case(
            verb,
            lambda r: ["--data", str(r / data), "--out", str(r / "file.txt" / "o")],
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(
            verb,
            lambda r: ["--data", str(r / data), "--out", f"{UNWRITABLE}/o"],
            2,
            UNWRITABLE,
        ),
        Case(
            verb,
            lambda r: (
                ["--data", str(r / data), "--out", str(r / "out")]
                + ["--resume", str(r / "nowhere")]
            ),
            1,
            "nowhere",
        ),
    ]
    for name, says in (
        ("junk.gguf", ""),
        ("empty.gguf", ""),
        ("file.txt", ""),
        ("badweights", "model.safetensors"),
    ):
        cases.append(
            Case(
                verb,
                lambda r, n=name: d("--model", str(r / n))(r),
                1,
                says or name,
            )
        )
    # dpo's LoRA options are finetune's, checked by the same code
    lora = [case for case in cases if "--lora" in " ".join(case.args(Path("/r")))]
    return [case for case in cases if verb == "finetune" or case not in lora]


def _finetune_dpo_cases() -> list[Case]:
    def f(verb: str, name: str) -> Case:
        return Case(
            verb, lambda r: ["--data", str(r / name), "--out", str(r / "o")], 1, name
        )

    p = dpo_argv

    return [
        f("finetune", "chat_numbers.jsonl"),
        f("finetune", "chat_empty_object.jsonl"),
        f("finetune", "pairs.jsonl"),
        f("dpo", "pairs_then_junk.jsonl"),
        f("dpo", "pairs_empty_reply.jsonl"),
        f("dpo", "latin1.csv"),
        Case("dpo", p("--beta", "inf"), 2, "--beta"),
        Case("dpo", p("--beta", "abc"), 2, "--beta"),
        Case("dpo", lambda r: p("--reference", str(r / "folder"))(r), 1, "folder"),
        Case(
            "dpo", lambda r: p("--reference", str(r / "junk.gguf"))(r), 1, "junk.gguf"
        ),
        Case(
            "finetune",
            lambda r: ["--data", str(r / "chat.jsonl"), "--out", str(r / "ft")],
            143,
            "stopped by SIGTERM; nothing was saved",
            about="--data chat.jsonl --out DIR, SIGTERM while the model loads",
            fault=stop_at("smol.commands.tuning", "load_tuned", 1, signal.SIGTERM),
        ),
    ]


def _grpo_cases() -> list[Case]:
    def q(*more: str) -> Argv:
        return lambda r: ["--task", "add", "--out", str(r / "o"), *more]

    return [
        *refused(
            "grpo",
            q,
            "--group-size 0 -> --group-size",
            "--group-size 2.5 -> --group-size",
            "--beta nan -> --beta",
            "--beta inf -> --beta",
            "--epsilon -1 -> --epsilon",
            "--epsilon inf -> --epsilon",
            "--epsilon-high nan -> --epsilon-high",
            "--temperature -1 -> --temperature",
            "--temperature inf -> --temperature",
            "--max-new-tokens -1 -> --max-new-tokens",
            "--format-weight nan -> --format-weight",
            "--steps 0 -> steps",
            "--batch-size 0 -> batch_size",
            "--lr nan -> lr",
            "--lora-r -1 -> --lora-r",
            "--model '' -> --model",
            "--out '' -> --out",
            "--resume --overwrite -> overwrite",
            "--seed -1 -> seed",
            "--max-len 0 -> seq_len",
            "--dtype fp64 -> dtype",
            "--device tpu -> device",
        ),
        Case("grpo", ["--task", "ADD", "--out", "o"], 2, "ADD"),
        Case("grpo", lambda r: q("--model", str(r / "junk.gguf"))(r), 1, "junk.gguf"),
        Case(
            "grpo",
            lambda r: ["--task", "add", "--out", str(r / "file.txt")],
            2,
            "file.txt",
            keep="file.txt",
        ),
    ]


def _eval_cases() -> list[Case]:
    e = "eval"

    def m(*more: str) -> Argv:
        return ["mmlu", *more]

    def compare(before: str, after: str = "run_a", says: str = "", **kw) -> Case:
        return Case(
            e,
            lambda r: ["compare", str(r / before), str(r / after)],
            1,
            says or before,
            **kw,
        )

    return [
        *refused(
            e,
            m,
            "--limit 1.5 -> --limit",
            "--shots 1.5 -> --shots",
            "--token-budget -1 -> --token-budget",
            "--threads -1 -> --threads",
            f"--threads {HUGE} -> --threads",
            "--seed -1 -> --seed",
            f"--seed {HUGE} -> --seed",
            "--formulation bogus -> --formulation",
            "--device cuda:x -> --device",
            "--out '' -> --out",
        ),
        *refused(
            e,
            lambda task, *more: [task, *more],
            "hellaswag --shots -1 -> --shots",
            "arc-easy --token-budget 0 -> --token-budget",
            "piqa --model '' -> --model",
            "winogrande --limit -1 -> --limit",
            "commonsenseqa-cloze --limit 0 -> --limit",
            "openbookqa --device tpu -> --device",
            "all --threads 0 -> --threads",
            "compare -> before",
            "compare a b --by bogus -> --by",
        ),
        Case(e, lambda r: m("--model", str(r / "folder")), 1, "folder"),
        Case(e, lambda r: m("--model", str(r / "file.txt")), 1, "file.txt"),
        Case(e, lambda r: m("--model", str(r / "junk.gguf")), 1, "junk.gguf"),
        Case(e, lambda r: m("--model", str(r / "badconfig")), 1, "config.json"),
        Case(e, lambda r: m("--out", str(r / "file.txt" / "res")), 2, "--out"),
        Case(e, ["mmlu", "--out", f"{UNWRITABLE}/results"], 2, "--out"),
        Case(
            e,
            lambda r: ["all", "--out", str(r / "file.txt")],
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(
            e,
            ["hellaswag", "--limit", "20"],
            130,
            "discarded",
            about="hellaswag --limit 20, Ctrl-C in its 1st batch",
            fault=stop_at("smol.evaluate", "choice_logprobs", 1),
        ),
        compare("run_a", "file.txt", says="file.txt"),
        compare(
            "run_twice", about="compare $TMP/run_twice $TMP/run_a (question 0 twice)"
        ),
        compare("run_other", says="no question", about="compare (no question in both)"),
        compare("run_short"),
        compare("run_negative"),
        compare_csv("no/where.csv", "no"),
        compare_csv("latin1.csv", "latin1.csv", keep="latin1.csv"),
        Case(
            e,
            lambda r: ["compare", str(r / "run_a"), str(r / "run_a"), "--csv", ""],
            2,
            "--csv",
        ),
        compare_csv(f"{UNWRITABLE}/c.csv", "--csv"),
    ]


def _export_cases() -> list[Case]:
    x = "export"
    return [
        Case(x, ["smollm2", "o.gguf", "--type", "q4"], 2, "--type"),
        Case(x, ["smollm2", "o.gguf", "--name", "   "], 2, "--name"),
        Case(x, ["smollm2", ""], 2, "out"),
        Case(x, ["   ", "o.gguf"], 2, "model"),
        Case(x, lambda r: ["smollm2", str(r / "file.txt" / "o.gguf")], 2, "file.txt"),
        Case(x, ["smollm2", f"{UNWRITABLE}/o.gguf"], 2, "OUT"),
        Case(x, ["smollm2", "o.gguf", "--name", NOT_UTF8], 2, "--name"),
        Case(
            x,
            lambda r: (
                [str(r / "junk.gguf"), str(r / "folder" / ".." / "junk.gguf")]
                + ["--overwrite"]
            ),
            2,
            "model",
            keep="junk.gguf",
        ),
        Case(x, lambda r: [str(r / "badweights"), str(r / "o.gguf")], 1, "safetensors"),
        Case(x, lambda r: [str(r / "latin1config"), str(r / "o.gguf")], 1, "config"),
        Case(x, lambda r: [str(r / "listconfig"), str(r / "o.gguf")], 1, "config.json"),
        Case(
            x,
            lambda r: [str(r / "cut.gguf"), str(r / "o.gguf")],
            1,
            "cut.gguf",
            about="$TMP/cut.gguf $TMP/o.gguf (a GGUF cut short in its tensors)",
            setup=truncated_gguf(40 * 2**20),
            gone="o.gguf",
        ),
        Case(
            x,
            lambda r: ["smollm2", str(r / "fresh.gguf")],
            143,
            "fresh.gguf was not written",
            about="smollm2 $TMP/fresh.gguf, SIGTERM while writing",
            fault=stop_at("smol.export", "pack_tensor_info", 3, signal.SIGTERM),
            gone="fresh.gguf",
        ),
    ]


def _grade_cases() -> list[Case]:
    gr = "grade"

    def nb(*more: str) -> Argv:
        return lambda r: [str(r / "notebooks"), *more]

    def book(*more: str) -> Argv:
        return lambda r: [str(r / "class"), "--gradebook", str(r / "g.csv"), *more]

    def paths(*names: str, expect: int = 2, says: str = "", **kw) -> Case:
        return Case(
            gr,
            lambda r: [n if n.startswith("-") else str(r / n) for n in names],
            expect,
            says or names[0],
            **kw,
        )

    return [
        *refused(
            gr,
            nb,
            "--timeout inf -> --timeout",
            "--timeout -5 -> --timeout",
            "--timeout abc -> --timeout",
            "--cell-timeout 0 -> --cell-timeout",
            "--cell-timeout nan -> --cell-timeout",
            "--check-timeout inf -> --check-timeout",
            "--regrade -> --regrade",
            "--overwrite -> --overwrite",
            "--tasks '' -> --tasks",
            "--json '' -> --json",
        ),
        *refused(
            gr,
            book,
            "--jobs -1 -> --jobs",
            "--jobs 1.5 -> --jobs",
            "--strict -> --strict",
            "--json - -> --json",
        ),
        Case(gr, book("--gradebook", ""), 2, "gradebook"),
        Case(gr, lambda r: book("--json", str(r / "g.csv"))(r), 2, "--json"),
        Case(
            gr,
            lambda r: [str(r / "class"), "--gradebook", str(r / "folder")],
            2,
            "folder",
        ),
        Case(
            gr,
            lambda r: [str(r / "class"), "--gradebook", str(r / "no" / "g.csv")],
            2,
            "no",
        ),
        Case(
            gr,
            lambda r: [str(r / "folder"), "--gradebook", str(r / "g.csv")],
            2,
            "folder",
        ),
        Case(
            gr,
            lambda r: book("--feedback", str(r / "file.txt"))(r),
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(gr, lambda r: book("--feedback", str(r / "no" / "fb"))(r), 2, "no"),
        Case(
            gr,
            lambda r: book("--feedback", str(r / "feedback"))(r),
            2,
            "alice.md",
            keep="feedback/alice.md",
        ),
        paths(
            "notebooks/broken.ipynb", "--json", "notebooks/broken.ipynb", says="--json"
        ),
        paths("notebooks", "--json", "folder", says="folder"),
        paths("notebooks", "--json", f"{UNWRITABLE}/r.json", says="r.json"),
        paths("latin1.ipynb", "--json", "-", expect=1),
        paths("empty.ipynb", "--json", "-", expect=1),
        paths("notebooks/broken.ipynb", "--json", "-", expect=1, says="broken.ipynb"),
        paths("dir.ipynb"),
        paths(
            "class/alice/01_rmsnorm.ipynb",
            "class/alice/01_rmsnorm.ipynb",
            "--json",
            "-",
            says="01_rmsnorm.ipynb",
            about="$TMP/class/alice/01_rmsnorm.ipynb twice --json -",
        ),
        paths(
            "class/alice",
            "class/alice/01_rmsnorm.ipynb",
            "--json",
            "-",
            says="01_rmsnorm.ipynb",
            about="$TMP/class/alice and its notebook --json -",
        ),
        Case(
            gr,
            lambda r: [str(r / "class"), "--gradebook", str(r / "book.csv")],
            130,
            "interrupted",
            about="$TMP/class --gradebook $TMP/book.csv, Ctrl-C while grading",
            fault=stop_at("smol.grading.gradebook", "grade_class", 1),
            gone="book.csv",
        ),
    ]


# --- smol grade for instructors: Gradescope, exports, hand-in folders ---------------
# (a block of its own: outputs that are not regular files, class folders as
# downloads leave them, and the options of tests/test_gradescope.py)


def make_instructor_files(root: Path) -> None:
    """Class folders as downloads leave them, beside make_files' class/."""
    notebook = (root / "class" / "alice" / "01_rmsnorm.ipynb").read_bytes()
    for name, extra in (
        ("class_macosx", "__MACOSX/alice/01_rmsnorm.ipynb"),
        ("class_twice", "alice/01_rmsnorm (1).ipynb"),
        ("class_empty", "bob/notes.txt"),
    ):
        (root / name / "alice").mkdir(parents=True)
        (root / name / "alice" / "01_rmsnorm.ipynb").write_bytes(notebook)
        (root / name / extra).parent.mkdir(parents=True, exist_ok=True)
        (root / name / extra).write_bytes(notebook)
    (root / "handin").mkdir()
    (root / "handin" / "notes.txt").write_text("my notes\n", encoding="utf-8")


def bob_is_missing(root: Path) -> str:
    """What book.csv lacks: bob's rows, marked missing (his folder holds no
    notebook)."""
    text = (root / "book.csv").read_text(encoding="utf-8")
    bob = [line for line in text.splitlines() if line.startswith("bob,")]
    return "" if bob and all(b.endswith(",missing") for b in bob) else "no bob"


def instructor_cases() -> list[Case]:
    gr = "grade"

    def class_book(folder: str, *more: str) -> Argv:
        return lambda r: [str(r / folder), "--gradebook", str(r / "book.csv"), *more]

    def nb(*more: str) -> Argv:
        return lambda r: [str(r / "notebooks"), *more]

    return [
        Case(gr, nb("--json", "/dev/full"), 2, "/dev/full"),
        Case(gr, class_book("class", "--json", "/dev/full"), 2, "/dev/full"),
        Case(gr, lambda r: [str(r / "class"), "--gradebook", "/dev/full"], 2, "full"),
        Case(gr, class_book("class", "--canvas", "/dev/full"), 2, "/dev/full"),
        *(  # each output in a folder no one may write: refused before any grading
            Case(gr, class_book("class", option, f"{UNWRITABLE}/{name}"), 2, name)
            for option, name in (
                ("--feedback", "fb"),
                ("--canvas", "c.csv"),
                ("--nbgrader", "n.csv"),
            )
        ),
        Case(gr, ["01", "--autograder", f"{UNWRITABLE}/a.zip"], 2, "a.zip"),
        Case(gr, class_book("class_macosx"), 2, "__MACOSX"),
        Case(gr, class_book("class_twice"), 2, "01_rmsnorm (1).ipynb"),
        Case(
            gr,
            class_book("class_empty", "--jobs", "1"),
            0,
            about="$TMP/class_empty --gradebook $TMP/book.csv (bob's folder holds no "
            "notebook)",
            check=bob_is_missing,
        ),
        *refused(
            gr,
            nb,
            "--format gradescope --hidden nosuch -> nosuch",
            "--format gradescope --hidden rms/zz -> zz",
            "--hidden rms -> --hidden",
            "--visibility hidden -> --visibility",
            "--format pdf -> --format",
            "--nbgrader n.csv -> --nbgrader",
            "--exercise 17 -> 17",
        ),
        Case(
            gr,
            lambda r: [str(r / "notebooks"), str(r / "folder"), "--exercise", "01"],
            2,
            "--exercise",
        ),
        *refused(
            gr,
            lambda *more: class_book("class", *more),
            "--format gradescope -> gradescope",
            "--exercise 01 -> --exercise",
        ),
        Case(
            gr,
            lambda r: class_book("class", "--canvas", str(r / "book.csv"))(r),
            2,
            "own",
        ),
        Case(gr, lambda r: ["17", "--autograder", str(r / "a.zip")], 2, "17"),
        *refused(
            gr,
            lambda *more: lambda r: ["01", "--autograder", *more],
            "a.txt -> .zip",
            "a.zip --json r.json -> --json",
            "a.zip --format gradescope -> --format",
        ),
        Case(
            gr,
            lambda r: ["01", "--autograder", str(r / "file.txt")],
            2,
            "file.txt",
            keep="file.txt",
        ),
        Case(
            gr,
            lambda r: [str(r / "handin"), "--exercise", "01", "--json", "-"],
            1,
            "no notebook of 01_rmsnorm",
        ),
    ]


# --- post-training commands, a third round: runs replaced and resumed, beta, sizes ----


def a_run_of(verb: str) -> Callable[[Path], None]:
    """A setup: VERB_run/, a finished run of `smol VERB` (its settings file, merged
    model and a checkpoint folder; a train run's summary and checkpoints)."""

    def setup(root: Path) -> None:
        run = root / f"{verb}_run"
        training = run if verb == "train" else run / "training"
        (training / "checkpoints" / "step_0000003").mkdir(parents=True)
        if verb == "train":
            (run / "summary.json").write_text("{}", encoding="utf-8")
        else:
            (training / f"{verb}.json").write_text("{}", encoding="utf-8")
        (run / "model.safetensors").write_text("the earlier model", encoding="utf-8")

    return setup


def damaged_gguf(root: Path) -> None:
    """twice.gguf: the bundled GGUF with its layer-0 query weight named as layer 1's."""
    from smol.gguf import bundled_gguf_path

    data = bundled_gguf_path().read_bytes()
    at = data.index(b"blk.0.attn_q.weight")
    (root / "twice.gguf").write_bytes(data[:at] + b"blk.1" + data[at + 5 :])


def _post_training_cases() -> list[Case]:
    p, g = dpo_argv, "grpo"

    def q(*more: str) -> Argv:
        return lambda r: ["--task", "add", "--out", str(r / "o"), *more]

    def resumed(made: str, verb: str, argv: Argv) -> Case:
        return Case(
            verb,
            argv,
            2,
            f"smol {made}",
            keep=f"{made}_run/model.safetensors",
            about=f"--out $TMP/{made}_run --resume (a smol {made} run)",
            setup=a_run_of(made),
        )

    return [
        Case(
            "dpo",
            lambda r: (
                ["--data", str(r / "pairs.jsonl"), "--out", str(r / "dpo_run")]
                + ["--overwrite"]
            ),
            143,
            "is as it was",
            keep="dpo_run/model.safetensors",
            about="--out $TMP/dpo_run --overwrite (a finished run), SIGTERM as the "
            "new run starts",
            setup=a_run_of("dpo"),
            fault=stop_at(
                "smol.commands.tuning", "trained_parameters", 1, signal.SIGTERM
            ),
            gone=".dpo_run.overwrite",
        ),
        resumed(
            "grpo",
            "dpo",
            lambda r: p("--resume")(r)[:2] + ["--out", str(r / "grpo_run"), "--resume"],
        ),
        resumed(
            "dpo",
            g,
            lambda r: ["--task", "add", "--out", str(r / "dpo_run"), "--resume"],
        ),
        resumed(
            "finetune",
            "dpo",
            lambda r: p()(r)[:2] + ["--out", str(r / "finetune_run"), "--resume"],
        ),
        resumed(
            "dpo",
            "train",
            lambda r: ["--out-dir", str(r / "dpo_run"), "--resume", "--device", "cpu"],
        ),
        resumed(
            "train",
            "dpo",
            lambda r: p()(r)[:2] + ["--out", str(r / "train_run"), "--resume"],
        ),
        Case(
            "dpo",
            lambda r: ["--data", str(r / "pairs_empty_prompt.jsonl")],
            1,
            "pairs_empty_prompt.jsonl",
            setup=lambda r: (r / "pairs_empty_prompt.jsonl").write_text(
                json.dumps({**PAIR, "prompt": ""}) + "\n", encoding="utf-8"
            ),
        ),
        *refused(
            "dpo",
            p,
            "--beta 1e-320 -> --beta",
            "--beta 1e308 -> --beta",
            "--beta 5e-324 -> --beta",
        ),
        *refused(
            g,
            q,
            "--beta 1e-320 -> --beta",
            "--beta 1e308 -> --beta",
            "--batch-size 1000000 -> --batch-size",
        ),
        Case(g, q("--group-size", "1000000000"), 1, "--group-size"),
        Case(g, q("--out", f"{UNWRITABLE}/o"), 2, UNWRITABLE),
        Case("dpo", lambda r: p("--out", f"{UNWRITABLE}/o")(r), 2, UNWRITABLE),
        Case(
            "export",
            ["smollm2", "o.gguf"],
            2,
            "./smollm2",
            about="smollm2 o.gguf, where a folder ./smollm2 exists",
            here=lambda w: (w / "smollm2").mkdir(),
        ),
        Case(
            "export",
            lambda r: [str(r / "twice.gguf"), str(r / "o.gguf")],
            1,
            "twice.gguf is not a valid gguf",
            about="$TMP/twice.gguf (a tensor named twice) $TMP/o.gguf",
            setup=damaged_gguf,
            gone="o.gguf",
        ),
    ]
