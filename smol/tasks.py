"""Arithmetic questions with exact answers: tasks whose replies a program can grade.

A task is a family of questions such as "What is 7 * 38? Answer with the number only."
(`TASKS` names them). `problems(task, split, n, seed)` draws n different questions of
one split, the same ones for the same seed. Each question belongs to exactly one split,
decided by the question's own text (its SHA-256 as a number, modulo 5: 0 or 1 holds it
out for evaluation, about two questions in five; the rest are for training), so no seed
and no n can make the two splits share a question. `from_question` reads a question
back into its Problem, answer included.

`check(reply, answer)` reads the reply's last number, as in "7 * 38 = 266": the first
number is an operand. `well_formed(reply)` says whether the reply is what the question
asks for, the number and nothing else.

`answer(model, tokenizer, problems)` gives each question's replies, greedy or
sampled; `preference_pairs(problems, replies)` pairs a checked-right reply with a wrong
one of the same question: chapter 15's pairs, made of the model's own replies."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from smol.generate import generate

INSTRUCTION = "Answer with the number only."
# chapter 15's preference pairs, built by bench/make_pairs.py from the training split
PAIRS_FILE = Path(__file__).parent / "assets" / "preference_pairs.jsonl"
SPLITS = ("train", "held_out")


@dataclass(frozen=True)
class Task:
    """Questions "What is a <symbol> b?" for a and b in their inclusive ranges."""

    symbol: str
    a_range: tuple[int, int]
    b_range: tuple[int, int]
    solve: Callable[[int, int], int]


TASKS = {
    "add": Task("+", (1, 20), (1, 20), lambda a, b: a + b),
    "multiply": Task("*", (2, 12), (2, 50), lambda a, b: a * b),
}

# a number as a reply writes it: an optional minus, digits, maybe thousands commas
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
ONLY_A_NUMBER = re.compile(r"\s*-?\d+(?:,\d{3})*\.?\s*")
QUESTION = re.compile(
    rf"What is (\d+) (\S) (\d+)\? {re.escape(INSTRUCTION)}", flags=re.ASCII
)


@dataclass(frozen=True)
class Problem:
    """One question: the user's message and the integer that answers it."""

    task: str
    question: str
    answer: int

    def messages(self) -> list[dict]:
        """The question as a chat: [{"role": "user", "content": question}]."""
        return [{"role": "user", "content": self.question}]


def _check_task(task: str) -> Task:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: expected one of {sorted(TASKS)}")
    return TASKS[task]


def _check_str(name: str, value) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")


def split_of(question: str) -> str:
    """The split ("train" or "held_out") that a question belongs to, from its text."""
    _check_str("question", question)
    if not question:
        raise ValueError("question must not be empty")
    digest = int(hashlib.sha256(question.encode("utf-8")).hexdigest(), 16)
    return "held_out" if digest % 5 < 2 else "train"


def make_problem(task: str, a: int, b: int) -> Problem:
    """The question of `task` on operands a and b, with its answer."""
    spec = _check_task(task)
    for name, x, (lo, hi) in (("a", a, spec.a_range), ("b", b, spec.b_range)):
        if not isinstance(x, int) or isinstance(x, bool) or not lo <= x <= hi:
            raise ValueError(
                f"{task}: operand {name} must be an int in [{lo}, {hi}], got {x!r}"
            )
    question = f"What is {a} {spec.symbol} {b}? {INSTRUCTION}"
    return Problem(task, question, spec.solve(a, b))


def from_question(question: str) -> Problem:
    """The Problem whose question this is (so its answer), as make_problem wrote it."""
    _check_str("question", question)
    match = QUESTION.fullmatch(question)
    task = match and next(
        (t for t, spec in TASKS.items() if spec.symbol == match[2]), None
    )
    if task is None:
        raise ValueError(f"not a question of any task: {question[:80]!r}")
    return make_problem(task, int(match[1]), int(match[3]))


def pool(task: str, split: str) -> list[Problem]:
    """Every question of `task` in `split`, in the order of their operands."""
    spec = _check_task(task)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: expected one of {SPLITS}")
    (lo_a, hi_a), (lo_b, hi_b) = spec.a_range, spec.b_range
    every = [
        make_problem(task, a, b)
        for a in range(lo_a, hi_a + 1)
        for b in range(lo_b, hi_b + 1)
    ]
    return [p for p in every if split_of(p.question) == split]


def problems(task: str, split: str, n: int, seed: int = 0) -> list[Problem]:
    """n different questions of `task` from `split`, drawn in an order fixed by seed."""
    pool_ = pool(task, split)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(pool_):
        raise ValueError(
            f"n must be an int in [0, {len(pool_)}] (the {split} questions of "
            f"{task}), got {n!r}"
        )
    return random.Random(f"{task}/{split}/{seed}").sample(pool_, n)


def numbers(reply: str) -> list[float]:
    """Every number in reply, in order ("1,000" is 1000; "-8" is -8)."""
    _check_str("reply", reply)
    return [float(x.replace(",", "")) for x in NUMBER.findall(reply)]


def parse_answer(reply: str) -> float | None:
    """The last number in reply, or None when it has none."""
    found = numbers(reply)
    return found[-1] if found else None


def check(reply: str, answer: int) -> bool:
    """Whether the reply's last number equals answer ("266", "7 * 38 = 266.")."""
    if not isinstance(answer, int) or isinstance(answer, bool):
        raise TypeError(f"answer must be an int, got {answer!r}")
    return parse_answer(reply) == answer


def well_formed(reply: str) -> bool:
    """Whether the reply is one number and nothing else (a final period allowed)."""
    _check_str("reply", reply)
    return ONLY_A_NUMBER.fullmatch(reply) is not None


@torch.no_grad()
def answer(
    model,
    tokenizer,
    problems: list[Problem],
    *,
    samples: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 24,
    batch_size: int = 32,
    seed: int = 0,
) -> list[list[str]]:
    """Each problem's replies from the model, `samples` of them (temperature 0: the one
    greedy reply), in left-padded batches of at most batch_size rows; the same replies
    for the same seed on the same machine."""
    for name, value in (
        ("samples", samples),
        ("max_new_tokens", max_new_tokens),
        ("batch_size", batch_size),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if temperature == 0 and samples != 1:
        raise ValueError(f"greedy decoding gives one reply a question, not {samples}")
    if not all(isinstance(p, Problem) for p in problems):
        raise TypeError("problems must be a list of Problem (see tasks.problems)")
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed)
    rows = [p for p in problems for _ in range(samples)]  # each question samples times
    texts = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        prompts = [tokenizer.apply_chat_template(p.messages()) for p in chunk]
        ids, mask = tokenizer.batch_encode(prompts, device=device)  # (B, T)
        out = generate(
            model,
            ids,
            max_new_tokens,
            temperature=temperature,
            attention_mask=mask,
            eos_token_id=tokenizer.eos_token_id,
            generator=generator,
        )  # (B, T + new)
        texts += tokenizer.batch_decode(out[:, ids.shape[1] :].tolist(), True)
    return [texts[i : i + samples] for i in range(0, len(texts), samples)]


def preference_pairs(
    problems: list[Problem], replies: list[list[str]], per_question: int = 3
) -> list[dict]:
    """Pairs in TRL's conversational format from each problem's replies: chosen a reply
    that check() accepts, rejected one it does not, at most per_question pairs a
    question, each distinct reply used once a side while others remain. A question
    whose replies are all right, or all wrong, gives no pair."""
    if len(problems) != len(replies):
        raise ValueError(
            f"{len(problems)} problems but {len(replies)} lists of replies"
        )
    pairs = []
    for problem, texts in zip(problems, replies):
        distinct = list(dict.fromkeys(t.strip() for t in texts if t.strip()))
        right = [t for t in distinct if check(t, problem.answer)]
        wrong = [t for t in distinct if not check(t, problem.answer)]
        if not right or not wrong:
            continue
        for i in range(min(per_question, max(len(right), len(wrong)))):
            pairs.append(
                {
                    "prompt": problem.messages(),
                    "chosen": [{"role": "assistant", "content": right[i % len(right)]}],
                    "rejected": [
                        {"role": "assistant", "content": wrong[i % len(wrong)]}
                    ],
                }
            )
    return pairs
