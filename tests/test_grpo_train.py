"""GRPO training (smol.grpo_train) on a tiny model with SmolLM2's vocabulary whose
replies are digits or nothing: the trainer's loss is smol.grpo's on the very batch it
sampled, a reward that raises or is not a number stops the run before that step
trains, bad settings are named, a stopped run resumes bit for bit (the sampler's
state included), and a few steps raise the reward. With num_iterations > 1 a batch
is sampled once and trained on that many steps, the clip binds, and a run stopped
within a batch resumes bit for bit."""

import math

import pytest
import torch

from smol import SmolLM, tasks
from smol.checkpoint import load
from smol.dpo import adapters_off
from smol.grpo import completion_logprobs, group_advantages, grpo_loss
from smol.grpo_rewards import RewardError, number_only, score, task_rewards
from smol.grpo_train import GRPOTrainer, completion_mask
from smol.lora import apply_lora
from smol.train import TrainConfig
from tests.tiny_models import config

DIGITS = range(32, 42)  # the tokens "0" .. "9" of SmolLM2's vocabulary
EOS = 2  # <|im_end|>
CLOCKED = {"tokens_per_s", "sample_s", "update_s"}  # wall-clock measures


@torch.no_grad()
def digit_lover(seed: int = 0) -> SmolLM:
    """A random tiny model (untied head, context 2048) that replies with digits or
    ends at once: every embedding holds 4 in its first dimension, so the final
    norm's output is about sqrt(32) there whatever the context, and the head turns
    that into about 7% a digit and 30% eos."""
    torch.manual_seed(seed)
    model = SmolLM(config(49152, 32, 64, 2, 4, 2, 2048, tie_word_embeddings=False))
    model.model.embed_tokens.weight[:, 0] = 4.0
    model.lm_head.weight[list(DIGITS), 0] = 2.1
    model.lm_head.weight[EOS, 0] = 2.4
    return model


def short(problem, reply) -> float:
    """A reward that varies within a group: 1 for an empty or one-digit reply."""
    return float(len(reply) <= 1)


def cpu_config(out, **settings) -> TrainConfig:
    """A run on the CPU in float32 at a constant learning rate, into `out`."""
    options = {"steps": 4, "batch_size": 2, "seq_len": 64, "warmup_steps": 0}
    options |= {"lr": 3e-2, "min_lr": 3e-2, "weight_decay": 0.0, "eval_every": 0}
    options |= {"log_every": 1, "device": "cpu", "dtype": "fp32", "progress": False}
    return TrainConfig(preset=None, out_dir=str(out), **options | settings)


def lora_trainer(tokenizer, out, lora=True, train=(), **options) -> GRPOTrainer:
    """A GRPOTrainer on the add task with groups of 4 replies of at most 4 tokens,
    the digit lover with LoRA of rank 2 (or fully), rewarded by `short`; `train`:
    the run's settings (cpu_config), `options` the trainer's."""
    model = digit_lover()
    if lora:
        apply_lora(model, 2, 4.0)
    settings = {"group_size": 4, "max_new_tokens": 4, "rewards": {"short": (short, 1)}}
    cfg = cpu_config(out, **dict(train))
    return GRPOTrainer(cfg, model, tokenizer, "add", **settings | options)


def test_the_mask_ends_at_the_first_eos_and_rewards_are_weighed():
    ids = torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8], [2, 2, 2, 2]])
    assert completion_mask(ids, 2).tolist() == [
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
    ]
    problem = tasks.make_problem("add", 3, 4)
    rewards = task_rewards(format_weight=0.5)
    assert score(rewards, [problem] * 3, ["7", "3 + 4 = 7", "8"]).tolist() == [
        1.5,
        1.0,
        0.5,
    ]
    assert list(task_rewards()) == ["correct"]
    assert number_only(problem, " 12. ") == 1.0 and number_only(problem, "12 x") == 0


@pytest.mark.parametrize(
    "loss_type, beta, lora",
    [("dapo", 0.1, True), ("grpo", 0.0, True), ("dr_grpo", 0.2, False)],
)
def test_the_loss_is_grpo_loss_on_the_batch_it_sampled(
    tokenizer, tmp_path, loss_type, beta, lora
):
    reference = None if lora else digit_lover(seed=1)
    trainer = lora_trainer(
        tokenizer, tmp_path, lora, beta=beta, loss_type=loss_type, reference=reference
    )
    model = trainer.model
    with torch.no_grad():  # a policy unlike its reference: the KL term counts
        for name, p in model.named_parameters():
            if p.requires_grad and (not lora or "lora_B" in name):
                p.add_(torch.randn_like(p) * 0.05)
    problems = trainer.problems[:3]
    loss = trainer.batch_loss(problems)
    r = trainer.last_rollout

    # the rollout: 4 replies a question, each decoded from its tokens up to eos
    assert r.problems == problems and r.completion_ids.shape[0] == 12
    ends = [row.index(EOS) if EOS in row else 4 for row in r.completion_ids.tolist()]
    assert r.completion_mask.sum(1).tolist() == [min(e + 1, 4) for e in ends]
    assert len(set(ends)) > 1  # lengths differ: the averaging is tested
    assert r.replies == [
        tokenizer.decode(row[:end], True)
        for row, end in zip(r.completion_ids.tolist(), ends)
    ]
    rows = [p for p in problems for _ in range(4)]
    rewards = torch.tensor([short(p, x) for p, x in zip(rows, r.replies)])
    assert torch.equal(r.rewards, rewards) and 0 < rewards.mean() < 1
    assert torch.equal(r.advantages, group_advantages(rewards, 4))
    # the loss, by smol.grpo on the same tokens
    batch = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    logps = completion_logprobs(model, *batch)
    with torch.no_grad():
        if lora:
            with adapters_off(model):
                ref = completion_logprobs(model, *batch)
        else:
            ref = completion_logprobs(reference, *batch)
    expected = grpo_loss(
        logps,
        logps.detach(),
        ref if beta else None,
        r.advantages,
        r.completion_mask,
        loss_type=loss_type,
        beta=beta,
        max_completion_length=4,
    )
    torch.testing.assert_close(loss, expected.loss, rtol=1e-6, atol=1e-7)
    assert loss.item() != 0
    assert (trainer._logs[-1][2] > 0).item() == (beta > 0)  # the KL logged


@pytest.mark.parametrize(
    "bad, says",
    [
        (lambda: 1 / 0, "raised ZeroDivisionError: division by zero"),
        (lambda: float("nan"), "gave nan"),
        (lambda: math.inf, "gave inf"),
        (lambda: "many", "raised ValueError"),
    ],
    ids=["raises", "nan", "inf", "not-a-number"],
)
def test_a_bad_reward_stops_the_run_before_its_step_trains(
    tokenizer, tmp_path, bad, says
):
    calls = []

    def flaky(problem, reply):
        calls.append(reply)
        return bad() if len(calls) > 8 else 0.0  # the first step's 8 replies pass

    rewards = {"short": (short, 1.0), "flaky": (flaky, 0.5)}
    trainer = lora_trainer(
        tokenizer, tmp_path, train={"ckpt_every": 1}, rewards=rewards
    )
    with pytest.raises(RewardError) as e:
        trainer.fit()
    message = str(e.value)
    assert message.startswith(f"reward 'flaky' {says}") and "What is" in message
    assert message.endswith("stopping before this step trains")
    assert trainer.step == 1  # the second step took no optimizer step
    weights, _ = load(trainer.checkpoint_root / "step_0000001")
    state = trainer.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in weights.items())


@pytest.mark.parametrize(
    "options, says",
    [
        ({"group_size": 1}, "group_size must be an int >= 2, got 1: a group of one"),
        ({"group_size": True}, "group_size must be an int >= 2, got True"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
        ({"beta": -0.1}, "beta must be a finite number >= 0, got -0.1"),
        ({"beta": math.nan}, "beta must be a finite number >= 0, got nan"),
        ({"epsilon": 0}, "epsilon must be a finite number > 0"),
        ({"epsilon_high": -1.0}, "epsilon_high must be a finite number > 0"),
        ({"temperature": 0.0}, "temperature must be a finite number > 0"),
        ({"loss_type": "ppo"}, "loss_type must be one of"),
        ({"num_iterations": 0}, "num_iterations must be an int >= 1"),
        ({"rewards": {}}, "rewards must be a non-empty dict"),
        ({"rewards": {"x": (1, 1.0)}}, r"reward 'x' must be \(function, finite"),
        ({"rewards": {"x": (short, math.nan)}}, r"reward 'x' must be \(function"),
        ({"task": "divide"}, "unknown task 'divide'"),
        ({"max_new_tokens": 30}, r"longest prompt of add \(\d+ tokens\) and max_new"),
        ({"lora": False, "beta": 0.1}, "holds no LoRA layers"),
        ({"reference": "small"}, "reference model's config differs"),
    ],
)
def test_bad_settings_are_named(tokenizer, tmp_path, options, says):
    model = digit_lover()
    if options.pop("lora", True):
        apply_lora(model, 2, 4.0)
    if options.get("reference") == "small":
        options["reference"] = SmolLM(config(49152, 16, 32, 1, 2, 1, 2048))
    task = options.pop("task", "add")
    with pytest.raises(ValueError, match=says):
        GRPOTrainer(cpu_config(tmp_path), model, tokenizer, task, **options)


def _run(tokenizer, out, until=None, resume=False):
    train = {"steps": 6, "ckpt_every": 2, "resume": resume, "log_every": 2}
    trainer = lora_trainer(tokenizer, out, train=train, beta=0.1)
    return trainer, trainer.fit(until)


def test_a_stopped_run_resumes_bit_for_bit(tokenizer, tmp_path):
    whole, history = _run(tokenizer, tmp_path / "whole")
    assert len(history["reward"]) == 6 and history["kl"][0] == 0  # B starts at 0
    assert history["kl"][-1] > 0 and all(s > 0 for s in history["sample_s"])
    _run(tokenizer, tmp_path / "parts", until=3)
    parts, resumed = _run(tokenizer, tmp_path / "parts", resume=True)
    assert resumed.keys() == history.keys()
    assert {k: v for k, v in resumed.items() if k not in CLOCKED} == {
        k: v for k, v in history.items() if k not in CLOCKED
    }
    ours = {n: p for n, p in parts.model.state_dict().items() if "lora_B" in n}
    theirs = whole.model.state_dict()
    assert ours and any(p.abs().sum() > 0 for p in ours.values())  # it trained
    assert all(torch.equal(p, theirs[n]) for n, p in ours.items())


def _first_eos(model, tokenizer, problem) -> float:
    """The model's probability of ending its reply to `problem` at once."""
    prompt = tokenizer.apply_chat_template(problem.messages())
    with torch.no_grad():
        logits, _ = model(torch.tensor([tokenizer.encode(prompt)]))
    return logits[0, -1].softmax(-1)[EOS].item()


def test_a_few_steps_raise_the_reward_and_evaluation_counts_right_replies(
    tokenizer, tmp_path, monkeypatch, capsys
):
    train = {"steps": 10, "batch_size": 4, "lr": 1e-2, "min_lr": 1e-2}
    train |= {"log_every": 5, "progress": True}
    trainer = lora_trainer(tokenizer, tmp_path, lora=False, train=train, beta=0.0)
    question = tasks.problems("add", "held_out", 1)[0]
    before = _first_eos(trainer.model, tokenizer, question)
    history = trainer.fit()
    # `short` rewards a reply that ends at once or after one digit
    assert _first_eos(trainer.model, tokenizer, question) > before + 0.2
    assert sum(history["reward"][-3:]) > sum(history["reward"][:3])
    assert all(0 <= s <= 1 for s in history["equal_groups"])
    # each log step's line: the last of its steps' numbers
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step")]
    assert [x.split(":")[0] for x in lines] == ["step 5", "step 10"]
    reward, equal = history["reward"][-1], history["equal_groups"][-1]
    assert lines[1].startswith(
        f"step 10: reward {reward:.3f}, equal groups {equal:.2f}"
    )
    # held-out accuracy, greedy: here the replies of a stand-in that is right twice
    held_out = trainer.held_out
    right = {p.question for p in held_out[:2]}

    def answer(model, tokenizer, problems, **_):
        return [[str(p.answer) if p.question in right else "0"] for p in problems]

    monkeypatch.setattr(tasks, "answer", answer)
    assert trainer.evaluate() == 1 - 2 / len(held_out)
    assert trainer.history["val_accuracy"] == [2 / len(held_out)]


def _iterated(tokenizer, out, num_iterations, until=None, resume=False, **train):
    """A run of 6 steps with each batch trained num_iterations times, LoRA at a high
    learning rate (the ratio moves within a batch), and every call of grpo_loss's
    old_logps and of the sampler recorded."""
    train = {"steps": 6, "ckpt_every": 0, "resume": resume, "lr": 0.3, **train}
    trainer = lora_trainer(
        tokenizer,
        out,
        train=train | {"min_lr": train["lr"]},
        beta=0.1,
        num_iterations=num_iterations,
    )
    calls = {"rollouts": 0, "old": []}
    rollout, rollout_loss = trainer.rollout, trainer.rollout_loss

    def counted(problems):
        calls["rollouts"] += 1
        return rollout(problems)

    def recorded(model, r, keep=False):
        out = rollout_loss(model, r, keep)
        calls["old"].append(None if r.old_logps is None else r.old_logps.clone())
        return out

    trainer.rollout, trainer.rollout_loss = counted, recorded
    return trainer, trainer.fit(until), calls


def test_one_iteration_samples_every_step_and_trains_on_policy(tokenizer, tmp_path):
    """num_iterations=1 is the run of one update a batch: a new batch each step, the
    old log-probabilities the policy's own (None), nothing kept to replay."""
    trainer, history, calls = _iterated(tokenizer, tmp_path, 1)
    assert calls["rollouts"] == 6 and calls["old"] == [None] * 6
    assert history["clip_ratio"] == [0.0] * 6 and not trainer.train_batches.replays
    assert trainer.train_batches.state_dict()["iterations"] == (1, 0, [])


def test_several_iterations_reuse_the_batch_and_the_clip_binds(tokenizer, tmp_path):
    """Rejects a trainer that samples every step (6 rollouts), or that trains the
    later steps on-policy (old log-probabilities of the policy now: no clip)."""
    trainer, history, calls = _iterated(tokenizer, tmp_path, 3)
    assert calls["rollouts"] == 2  # steps 1 and 4 sample, 2, 3, 5 and 6 reuse
    old = calls["old"]
    # the first update of a batch keeps the policy's log-probabilities as the old
    for first, later in ((0, (1, 2)), (3, (4, 5))):
        assert all(torch.equal(old[first], old[k]) for k in later)
    assert not torch.equal(old[0], old[3])  # a new batch, new replies
    clip = history["clip_ratio"]
    assert clip[0] == clip[3] == 0  # w = 1 on the first update
    assert max(clip[1], clip[2], clip[4], clip[5]) > 0  # the clip binds
    assert history["reward"][0:3] == [history["reward"][0]] * 3  # the same replies


def test_a_run_stopped_within_a_batch_resumes_bit_for_bit(tokenizer, tmp_path):
    """A checkpoint after step 2 of a batch trained 3 times holds the batch's replies
    and old log-probabilities: the resumed run samples nothing until step 4, and ends
    where an uninterrupted one does. Resuming with another num_iterations is
    refused."""
    whole, history, _ = _iterated(tokenizer, tmp_path / "whole", 3)
    _iterated(tokenizer, tmp_path / "parts", 3, until=2)
    with pytest.raises(ValueError, match="within a batch trained on 3 times"):
        _iterated(tokenizer, tmp_path / "parts", 2, resume=True)
    parts, resumed, calls = _iterated(tokenizer, tmp_path / "parts", 3, resume=True)
    assert calls["rollouts"] == 1  # step 3 replays the checkpoint's batch
    assert {k: v for k, v in resumed.items() if k not in CLOCKED} == {
        k: v for k, v in history.items() if k not in CLOCKED
    }
    ours = {n: p for n, p in parts.model.state_dict().items() if "lora_B" in n}
    assert all(torch.equal(p, whole.model.state_dict()[n]) for n, p in ours.items())
