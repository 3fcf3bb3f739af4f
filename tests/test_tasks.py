"""smol.tasks: arithmetic questions with exact answers, their split, the checker, the
replies a model gives and the preference pairs made from them. Each test names the wrong
implementation it rejects."""

import json

import pytest
import torch

from smol import tasks
from smol.dpo import check_pair
from smol.generate import generate
from tests.tiny_models import peaked, with_real_vocab


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_the_splits_share_no_question_and_cover_the_task(task):
    """A split drawn by position or by seed instead of by the question's own text would
    let some n or seed put a held-out question into training."""
    train, held = tasks.pool(task, "train"), tasks.pool(task, "held_out")
    spec = tasks.TASKS[task]
    count = (spec.a_range[1] - spec.a_range[0] + 1) * (
        spec.b_range[1] - spec.b_range[0] + 1
    )
    assert len(train) + len(held) == count
    assert not {p.question for p in train} & {p.question for p in held}
    assert 0.3 < len(held) / count < 0.5  # about two in five held out
    for seed in range(3):
        drawn = tasks.problems(task, "train", 50, seed=seed)
        assert all(tasks.split_of(p.question) == "train" for p in drawn)
        assert len({p.question for p in drawn}) == 50
    assert tasks.problems(task, "train", 20, 1) == tasks.problems(task, "train", 20, 1)
    assert tasks.problems(task, "train", 20, 1) != tasks.problems(task, "train", 20, 2)


def test_questions_answer_and_read_back():
    p = tasks.make_problem("multiply", 7, 38)
    assert p.answer == 266
    assert p.question == "What is 7 * 38? Answer with the number only."
    assert tasks.from_question(p.question) == p
    assert tasks.make_problem("add", 19, 20).answer == 39
    with pytest.raises(ValueError, match="operand b must be an int in"):
        tasks.make_problem("multiply", 7, 51)
    with pytest.raises(ValueError, match="not a question of any task"):
        tasks.from_question("What is 7 / 38? Answer with the number only.")
    with pytest.raises(ValueError, match="unknown task 'divide'"):
        tasks.pool("divide", "train")
    with pytest.raises(ValueError, match=r"n must be an int in \[0, "):
        tasks.problems("add", "held_out", 10_000)


@pytest.mark.parametrize(
    "reply, right, formed",
    [
        ("7 * 38 = 266", True, False),  # the first number is an operand
        ("266", True, True),
        ("266.", True, True),
        (" 266\n", True, True),
        ("The answer is 2,66.", False, False),
        ("266 is what 7 * 38 gives", False, False),  # the last number reads 38
        ("The answer is 276.", False, False),
        ("I cannot say.", False, False),
        ("-266", False, True),
    ],
)
def test_check_reads_the_last_number_and_well_formed_the_whole_reply(
    reply, right, formed
):
    """A checker reading the first number would mark "7 * 38 = 266" wrong."""
    assert tasks.check(reply, 266) is right
    assert tasks.well_formed(reply) is formed


def test_preference_pairs_prefer_a_right_reply_and_skip_questions_without_both():
    """Sides swapped, a question whose replies all agree paired anyway, or one reply
    used twice while others wait all fail here."""
    p, q, r = (tasks.make_problem("add", a, 3) for a in (1, 2, 4))
    replies = [
        ["4", "1 + 3 = 4", "5", "5", " 4 ", "It is 6."],  # 2 right, 2 wrong (distinct)
        ["5", "2 + 3 = 5"],  # all right: nothing to prefer
        ["8", "9"],  # all wrong
    ]
    pairs = tasks.preference_pairs([p, q, r], replies, per_question=3)
    assert len(pairs) == 2  # min(3, max(2 right, 2 wrong))
    for pair in pairs:
        pair = check_pair(pair)
        assert pair["prompt"] == p.messages()
        assert tasks.check(pair["chosen"], p.answer)
        assert not tasks.check(pair["rejected"], p.answer)
    assert {x["chosen"][0]["content"] for x in pairs} == {"4", "1 + 3 = 4"}
    assert {x["rejected"][0]["content"] for x in pairs} == {"5", "It is 6."}
    assert len(tasks.preference_pairs([p], replies[:1], per_question=1)) == 1
    with pytest.raises(ValueError, match="3 problems but 2 lists of replies"):
        tasks.preference_pairs([p, q, r], replies[:2])


def test_the_shipped_pairs_are_training_questions_ranked_by_the_checker():
    """A pair built from a held-out question, or with its sides the wrong way round,
    would make chapter 15's measurement meaningless."""
    lines = tasks.PAIRS_FILE.read_text().splitlines()
    assert len(lines) > 100
    for line in lines:
        pair = check_pair(json.loads(line))
        problem = tasks.from_question(pair["prompt"][-1]["content"])
        assert tasks.split_of(problem.question) == "train"
        assert tasks.check(pair["chosen"], problem.answer)
        assert not tasks.check(pair["rejected"], problem.answer)


def test_answer_gives_each_questions_own_continuation(tokenizer):
    """Batched, left-padded replies must equal each prompt run alone (a reply cut at
    the wrong position, or rows of a batch mixed up, fail); samples repeat for a seed
    and differ for another; greedy takes one reply a question."""
    model = peaked(with_real_vocab())
    problems = [tasks.make_problem("multiply", a, b) for a, b in ((2, 3), (12, 50))]
    problems.append(tasks.make_problem("add", 1, 1))
    greedy = tasks.answer(model, tokenizer, problems, max_new_tokens=6, batch_size=2)
    for problem, (reply,) in zip(problems, greedy):
        ids = torch.tensor(
            [tokenizer.encode(tokenizer.apply_chat_template(problem.messages()))]
        )
        alone = generate(
            model, ids, 6, temperature=0, eos_token_id=tokenizer.eos_token_id
        )
        assert reply == tokenizer.decode(alone[0, ids.shape[1] :].tolist(), True)
    sampled = tasks.answer(
        model, tokenizer, problems, samples=3, temperature=1.0, max_new_tokens=6
    )
    assert [len(r) for r in sampled] == [3, 3, 3]
    again = tasks.answer(
        model, tokenizer, problems, samples=3, temperature=1.0, max_new_tokens=6
    )
    other = tasks.answer(
        model, tokenizer, problems, samples=3, temperature=1.0, max_new_tokens=6, seed=1
    )
    assert sampled == again != other
    with pytest.raises(ValueError, match="greedy decoding gives one reply"):
        tasks.answer(model, tokenizer, problems, samples=2)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        tasks.answer(model, tokenizer, problems, batch_size=0)
    with pytest.raises(TypeError, match="problems must be a list of Problem"):
        tasks.answer(model, tokenizer, ["What is 2 * 3?"])
