"""What `smol eval` keeps of a run that Ctrl-C or SIGTERM stopped: the questions
scored so far, written to --out as TASK_questions.partial.csv (the rows
TASK_questions.csv would hold, for those questions only; MMLU's, `smol eval compare`
reads), never under the final names and with no summary, since the shortest prompts are
scored first and the questions done are not a sample of the benchmark. Without --out
they are discarded. Either way the line that says the run stopped says which."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from smol import evaluate


def partial_name(task: str) -> str:
    return f"{task}_questions.partial.csv"


class KeptScores:
    """evaluate.score, one batch (evaluate.row_batches) at a time, keeping each
    batch's scores as they come (done: request index -> scores), so that an
    interrupted run still has what it scored. The batches, and so the scores, are
    evaluate.score's own."""

    def __init__(self):
        self.done: dict[int, object] = {}

    def __call__(self, model, requests, token_budget=4096, progress=False, desc=""):
        from tqdm.auto import tqdm

        def length(i):  # as evaluate.score measures a request's row
            return len(requests[i][0]) + sum(map(len, requests[i][1]))

        self.done = {}
        order = sorted(range(len(requests)), key=length)
        # closed before an interruption's line, not redrawn after it
        with tqdm(total=len(requests), disable=not progress, desc=desc) as bar:
            for batch in evaluate.row_batches(order, length, token_budget):
                # one batch in: evaluate.score scores it as one batch
                batch_requests = [requests[i] for i in batch]
                found = evaluate.score(model, batch_requests, token_budget)
                self.done.update(zip(batch, found))
                bar.update(len(batch))
        return [self.done[i] for i in range(len(requests))]


def mmlu_results(
    model, tokenizer, questions, formulation, shots, token_budget, pool, scorer
) -> list[evaluate.Result]:
    """evaluate.evaluate(..., progress=True), scored by `scorer` (a KeptScores); an
    interruption carries the questions scored so far as its `.partial`."""
    examples = (
        evaluate.shots_for(questions, shots, pool) if shots else [[]] * len(questions)
    )
    requests, lengths = [], []
    for q, ex in zip(questions, examples):
        context, continuations = evaluate.prompt(q, formulation, ex)
        requests.append(evaluate.encode(tokenizer, context, continuations))
        lengths.append([len(c) for c in continuations])
    try:
        scores = scorer(model, requests, token_budget, True, f"MMLU {formulation}")
    except KeyboardInterrupt as e:
        e.partial = [
            evaluate.Result(questions[i], scorer.done[i].tolist(), lengths[i])
            for i in sorted(scorer.done)
        ]
        raise
    return [
        evaluate.Result(q, s.tolist(), n) for q, s, n in zip(questions, scores, lengths)
    ]


def card_partial(items: list, done: dict) -> list[evaluate.Result]:
    """The items of a card benchmark whose every request (one, or one per choice for
    partial scoring, as benchmarks.score flattens them) was scored."""
    results, at = [], 0
    for item in items:
        rows = range(at, at + (len(item.contexts) if item.partial else 1))
        at = rows.stop
        if all(i in done for i in rows):
            logprobs = [x for i in rows for x in done[i].tolist()]
            results.append(evaluate.Result(item, logprobs, item.lengths))
    return results


def keep_partial(
    e: BaseException,
    out: Path | None,
    task: str,
    total: int,
    results: list,
    write: Callable[[Path, list], None],
) -> None:
    """Write the questions scored before the interruption `e` to out (atomically:
    a second Ctrl-C leaves the whole file or none), and add to `e` a note saying
    where they are, or that they are discarded."""
    done = f"the {len(results)} of {total} {task} questions scored so far"
    if out is None or not results:
        hint = " (with --out they would be kept)" if out is None and results else ""
        e.add_note(f"{done} are discarded{hint}")
        return
    path = out / partial_name(task.lower())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp, results)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    e.add_note(
        f"{done} are in {path} (the shortest prompts first, not a sample of the "
        "benchmark; no summary written)"
    )
