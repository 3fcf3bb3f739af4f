"""`smol eval --shots K` before any scoring: the worked examples come from the other
questions of each question's subject (MMLU has no dev split here, the card's sets have
no train split), so K meets two limits. The hard one is the model's context: a prompt
longer than its positions (8192 for SmolLM2) cannot be scored, and as the longest
prompts are scored last the run would fail at its end; that is a UsageError naming the
most shots that fit. The soft one is a subject with fewer other questions than K: its
questions get fewer examples, which a warning on stderr says."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Sequence

from smol import evaluate
from smol.commands.common import UsageError

# a prompt of more characters than this many per position surely outgrows the context
# (SmolLM2's tokens average about four characters of text), so it is not tokenized
CHARS_PER_TOKEN = 16

# (question, its worked examples) -> [(context, [continuations])], one per row scored
Render = Callable[[object, list], list[tuple[str, list[str]]]]


def mmlu_render(formulation: str) -> Render:
    def render(q, shots):
        return [evaluate.prompt(q, formulation, shots)]

    return render


def card_render(item, shots):
    from smol import benchmarks

    contexts, continuations = benchmarks.prompt(item, shots)
    return [(c, continuations) for c in contexts]


def item_size(item) -> int:
    """Characters of a question's own text and longest choice (either kind)."""
    if isinstance(item, evaluate.Question):
        return len(item.question) + max(map(len, item.choices))
    return max(map(len, item.contexts)) + max(map(len, item.continuations))


def check_shots(
    task: str,
    shots: int,
    items: Sequence,
    pool: Sequence,
    tokenizer,
    context: int,
    render: Render,
) -> None:
    """UsageError when the longest question of some subject, with `shots` examples,
    makes a prompt longer than `context` positions; a warning when some subject has
    fewer other questions than `shots`."""
    if shots == 0 or not items:
        return
    by_subject = defaultdict(list)
    for q in pool:
        by_subject[q.subject].append(q)
    longest = {}
    for q in items:
        if q.subject not in longest or item_size(q) > item_size(longest[q.subject]):
            longest[q.subject] = q

    # the longest subjects first: an overflow shows at once
    order = sorted(longest.items(), key=lambda kv: -item_size(kv[1]))

    def overflow(k: int) -> str | None:
        """The first subject whose longest prompt with k examples outgrows the
        context (None when every one fits)."""
        for subject, q in order:
            examples = [s for s in by_subject[subject] if s is not q][:k]
            for ctx, continuations in render(q, examples):
                chars = len(ctx) + max(map(len, continuations))
                if chars > CHARS_PER_TOKEN * context:
                    return subject  # surely past the context
                ids, conts = evaluate.encode(tokenizer, ctx, continuations)
                if len(ids) + max(map(len, conts)) > context:
                    return subject
        return None

    subject = overflow(shots)
    if subject is not None:
        # low shots fit, high do not; past the largest subject's count
        # every prompt holds the same examples
        low, high = 0, min(shots, max(map(len, by_subject.values())))
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if overflow(mid) else (mid, high)
        raise UsageError(
            f"--shots {shots}: {task}'s prompts for {subject} would outgrow the "
            f"model's context of {context} positions; at most {low} shots fit every "
            "question"
        )
    fewer = [q for q in items if len(by_subject[q.subject]) - 1 < shots]
    if fewer:
        least = min(len(by_subject[q.subject]) - 1 for q in fewer)
        print(
            f"warning: --shots {shots}: {len(fewer)} of {len(items)} {task} questions "
            f"get fewer worked examples (as few as {max(least, 0)}): their subject has "
            "fewer other questions",
            file=sys.stderr,
            flush=True,
        )
