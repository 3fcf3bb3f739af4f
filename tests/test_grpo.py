"""GRPO by hand (smol.grpo) equals TRL's GRPOTrainer (trl 1.16): the group advantages
of the rewards TRL scored, the log-probabilities of TRL's own sampled completions, and,
on the same batch, the loss, the logged KL and clip ratios and every parameter's
gradient, for each loss_type smol covers ("grpo", "bnpo", "dr_grpo", "dapo", "cispo",
"sapo", "luspo"), beta 0 and beta > 0, token- and sequence-level ratios (GSPO),
symmetric and asymmetric clipping, the KL term weighed by the ratio (TRL's default
use_bias_correction_kl) or not, and a sampling temperature; with old log-probs
unlike the policy's, so that clipping is active. TRL's options left at their defaults
(delta, top_entropy_quantile, off_policy_mask_threshold, use_bias_correction_kl, vLLM's
importance sampling, entropy bonus, vespo) are not covered. Then each piece against
the wrong version it is named for, and bad inputs."""

import copy
import math

import pytest
import torch

from smol import SmolLM
from smol.grpo import (
    LOSS_TYPES,
    completion_logprobs,
    group_advantages,
    grpo_loss,
    kl_k3,
)
from tests.tiny_models import with_real_vocab

TINY = with_real_vocab()
G = 4  # completions a prompt
PROMPTS = [
    {"prompt": "What is 2 + 3?"},
    {"prompt": "Name a colour, please."},
    {"prompt": "Say yes."},  # every completion of this one scores the same
]
MAX_COMPLETION = 6
EOS = 2  # <|im_end|>, also the padding token


def reward(prompts, completion_ids, **_):
    """A checker stand-in: varied rewards, and a constant one for the third prompt
    (a group of equal rewards, advantages 0)."""
    return [
        1.0 if p == PROMPTS[2]["prompt"] else float(sum(ids) % 3)
        for p, ids in zip(prompts, completion_ids)
    ]


def _perturbed(model, seed, size=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * size * p.std().clamp_min(0.1))
    return model


@pytest.fixture(scope="module")
def models(tokenizer, tmp_path_factory):
    """(policy, reference, folder): two smol models unlike each other, and the
    policy saved as a Hugging Face folder (with the tokenizer) that TRL loads."""
    from smol.pretrained import save_pretrained

    torch.manual_seed(0)
    reference = SmolLM(TINY).eval()
    with torch.no_grad():  # norms away from one, as a trained model's are
        for name, p in reference.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    policy = _perturbed(copy.deepcopy(reference), seed=1)
    folder = tmp_path_factory.mktemp("policy")
    save_pretrained(policy, tokenizer, folder)
    return policy, reference, folder


def trl_trainer(folder, out, reward_funcs=reward, **options):
    """TRL's GRPOTrainer of the saved policy on PROMPTS, G completions a prompt in
    one batch (one process, no gradient accumulation), on the CPU in float32."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(out),
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        num_generations=G,
        per_device_train_batch_size=G * len(PROMPTS),
        max_completion_length=MAX_COMPLETION,
        **options,
    )
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=Dataset.from_list(PROMPTS),
    )
    trainer.current_gradient_accumulation_steps = 1  # as its training loop sets it
    trainer.model.train()
    return trainer


def generated(trainer):
    """TRL's sampled and scored batch, each prompt repeated G times (as its sampler
    gives them), and the rewards its checker returned."""
    rows = [p for p in PROMPTS for _ in range(G)]
    torch.manual_seed(0)
    return trainer._generate_and_score_completions(rows)


@pytest.fixture(scope="module")
def batch(models, tmp_path_factory):
    """TRL's own batch of completions, some cut short after an <|im_end|> as if the
    policy had ended them there (padded with the padding token, masked 0)."""
    pytest.importorskip("trl")
    _, _, folder = models
    trainer = trl_trainer(folder, tmp_path_factory.mktemp("gen"), beta=0.1)
    out = generated(trainer)
    ids, mask = out["completion_ids"].clone(), out["completion_mask"].clone()
    for row, length in enumerate([6, 3, 1, 6, 4, 6, 2, 5, 6, 6, 3, 6]):
        ids[row, length - 1] = EOS if length < MAX_COMPLETION else ids[row, -1]
        ids[row, length:], mask[row, length:] = EOS, 0
    return out, {**out, "completion_ids": ids, "completion_mask": mask}


@pytest.mark.parametrize("scale", ["group", "none"])
def test_advantages_and_logprobs_equal_trls_run(models, tmp_path, scale):
    """A whole TRL step up to the loss: its sampled completions, the rewards its
    checker gave, its advantages and its reference's log-probabilities (the reference
    is the policy as loaded) against smol's functions on the same tokens."""
    pytest.importorskip("trl")
    policy, _, folder = models
    rewards = []

    def recorded(**kwargs):
        rewards.extend(reward(**kwargs))
        return rewards[-len(kwargs["prompts"]) :]

    trainer = trl_trainer(folder, tmp_path, recorded, beta=0.1, scale_rewards=scale)
    out = generated(trainer)
    rewards = torch.tensor(rewards)
    assert rewards[: 2 * G].std() > 0 and (rewards[2 * G :] == 1).all()
    ours = group_advantages(rewards, G, scale=scale == "group")
    torch.testing.assert_close(ours, out["advantages"], rtol=0, atol=1e-6)
    assert (ours[2 * G :] == 0).all()  # the group of equal rewards

    with torch.no_grad():
        logps = completion_logprobs(
            policy,
            out["prompt_ids"],
            out["prompt_mask"],
            out["completion_ids"],
            out["completion_mask"],
        )
    assert (out["prompt_mask"] == 0).any()  # left padding is exercised
    torch.testing.assert_close(logps, out["ref_per_token_logps"], rtol=0, atol=1e-5)


CASES = [
    *(f"{loss}-beta0" for loss in LOSS_TYPES if loss != "luspo"),
    *(f"{loss}-beta0.1" for loss in LOSS_TYPES if loss != "luspo"),
    "luspo-beta0-sequence",
    "luspo-beta0.1-sequence",
    "grpo-beta0.1-sequence",
    "dapo-beta0.04-asymmetric",
    "grpo-beta0.1-temperature",
    "cispo-beta0-cispo_high",
    "grpo-beta0.1-plain_kl",
    "dapo-beta0.1-plain_kl-sequence",
]


@pytest.mark.parametrize("case", CASES)
def test_loss_metrics_and_gradients_equal_trl(models, batch, tmp_path, case):
    pytest.importorskip("trl")
    loss_type, beta, *more = case.split("-")
    beta = float(beta.removeprefix("beta"))
    policy, reference, folder = models
    options = {"loss_type": loss_type, "beta": beta}
    ours = {"loss_type": loss_type, "beta": beta, "max_completion_length": 6}
    temperature = 1.0
    if "sequence" in more:
        options["importance_sampling_level"] = "sequence"
        ours["importance_sampling_level"] = "sequence"
    if "asymmetric" in more:  # DAPO's clip-higher
        options.update(epsilon=0.1, epsilon_high=0.28)
        ours.update(epsilon_low=0.1, epsilon_high=0.28)
    if "cispo_high" in more:
        options.update(epsilon_high=1.1)
        ours.update(epsilon_high=1.1)
    if "plain_kl" in more:  # the KL term not weighed by the ratio
        options["use_bias_correction_kl"] = ours["use_bias_correction_kl"] = False
    if "temperature" in more:
        temperature = options["temperature"] = 0.7
    trainer = trl_trainer(folder, tmp_path, **options)
    _, inputs = batch
    tokens = [inputs[k] for k in ("prompt_ids", "prompt_mask")]
    tokens += [inputs[k] for k in ("completion_ids", "completion_mask")]
    mask = inputs["completion_mask"]

    mine = copy.deepcopy(policy).train()
    logps = completion_logprobs(mine, *tokens, temperature=temperature)
    with torch.no_grad():
        ref = completion_logprobs(reference, *tokens, temperature=temperature)
    # the sampling policy: another, further policy, so that ratios leave [0.8, 1.2]
    g = torch.Generator().manual_seed(2)
    old = (logps.detach() + 0.4 * torch.randn(logps.shape, generator=g)) * mask
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.3, -0.2, 1.5, -1.0, 0, 0, 0, 0])
    inputs = {
        **inputs,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    their_loss = trainer.compute_loss(trainer.model, inputs)
    their_loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    out = grpo_loss(logps, old, ref, advantages, mask, **ours)
    out.loss.backward()
    torch.testing.assert_close(out.loss, their_loss.detach(), rtol=0, atol=1e-6)
    if beta:
        assert metrics["kl"] > 1e-3
        assert out.kl.item() == pytest.approx(metrics["kl"], abs=1e-6)
    if loss_type == "cispo":
        assert out.clip_high.item() == pytest.approx(metrics["cispo_clip_ratio"])
    elif loss_type != "sapo":
        assert out.clip_low.item() == pytest.approx(metrics["clip_ratio/low_mean"])
        assert out.clip_high.item() == pytest.approx(metrics["clip_ratio/high_mean"])
        region = metrics["clip_ratio/region_mean"]
        assert out.clip_region.item() == pytest.approx(region)
        if "sequence" not in more:  # clipping active, both ways
            assert metrics["clip_ratio/low_mean"] > 0.05
            assert metrics["clip_ratio/high_mean"] > 0.05

    named = dict(trainer.model.named_parameters())
    for name, p in mine.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        torch.testing.assert_close(p.grad, named[name].grad, rtol=1e-4, atol=1e-6)


# --- the pieces, each against the wrong version it is named for ---------------------

# two completions of three token slots, the second one token shorter (padded, logp 0)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
LOGPS = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]])
# ratios w = exp(logp - old): e^0.5 = 1.65 and e^-0.5 = 0.61 leave [0.8, 1.2]
OLD = LOGPS - torch.tensor([[0.5, -0.5, 0.05], [0.5, -0.5, 0.0]])
REF = LOGPS + torch.tensor([[1.0, -0.8, 0.1], [-1.2, 0.6, 0.0]])
ADV = torch.tensor([1.0, -1.0])


def by_hand(loss_type="dapo", beta=0.0, eps=0.2):
    """The loss token by token, as the docstring of smol.grpo writes it."""
    rows = []
    for b in range(2):
        row = []
        for t in range(3):
            if MASK[b, t]:
                w, a = math.exp(LOGPS[b, t] - OLD[b, t]), ADV[b].item()
                clipped = min(max(w, 1 - eps), 1 + eps)
                d = (REF[b, t] - LOGPS[b, t]).item()
                kl = w * (math.exp(d) - d - 1)  # weighed by w, as TRL's default
                row.append(-min(w * a, clipped * a) + beta * kl)
        rows.append(row)
    if loss_type == "grpo":  # each completion's mean, then the mean of those
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    return sum(map(sum, rows)) / sum(map(len, rows))  # dapo, bnpo: token mean


def ours(loss_type="dapo", beta=0.0):
    logps = LOGPS.clone().requires_grad_()
    return grpo_loss(logps, OLD, REF, ADV, MASK, loss_type=loss_type, beta=beta)


def _ratio_and_kl(mask=MASK):
    w = torch.exp(LOGPS - OLD)
    return w, w * kl_k3(LOGPS, REF), mask.float()


def unclipped(beta=0.0):
    """The ratio times the advantage, never clipped."""
    w, kl, m = _ratio_and_kl()
    return ((-w * ADV[:, None] + beta * kl) * m).sum() / m.sum()


def clipped_on_the_wrong_side(beta=0.0):
    """The optimistic max of the two objectives in place of the pessimistic min."""
    w, kl, m = _ratio_and_kl()
    A = ADV[:, None]
    objective = torch.max(w * A, w.clamp(0.8, 1.2) * A)
    return ((-objective + beta * kl) * m).sum() / m.sum()


def kl_sign_flipped(beta=0.0):
    """The k3 estimate with d = logp - ref: the KL of the reference to the policy."""
    w, _, m = _ratio_and_kl()
    A = ADV[:, None]
    d = LOGPS - REF
    kl = w * (torch.exp(d) - d - 1)
    objective = torch.min(w * A, w.clamp(0.8, 1.2) * A)
    return ((-objective + beta * kl) * m).sum() / m.sum()


def padding_counted(beta=0.0):
    """Every token slot averaged, the padding after a short completion too."""
    w, kl, _ = _ratio_and_kl()
    A = ADV[:, None]
    objective = torch.min(w * A, w.clamp(0.8, 1.2) * A)
    return (-objective + beta * kl).mean()


def per_token_for_per_sequence(beta=0.0):
    """grpo's average taken over tokens (dapo's), not over completions."""
    return ours("dapo", beta).loss


def per_sequence_for_per_token(beta=0.0):
    """dapo's average taken over completions (grpo's), not over tokens."""
    return ours("grpo", beta).loss


@pytest.mark.parametrize(
    "loss_type, beta, mutant",
    [
        ("dapo", 0.0, unclipped),
        ("dapo", 0.0, clipped_on_the_wrong_side),
        ("dapo", 1.0, kl_sign_flipped),
        ("dapo", 0.0, padding_counted),
        ("grpo", 0.0, per_token_for_per_sequence),
        ("dapo", 0.0, per_sequence_for_per_token),
    ],
)
def test_the_loss_rejects_the_wrong_version(loss_type, beta, mutant):
    want = by_hand(loss_type, beta)
    got = ours(loss_type, beta).loss.item()
    assert got == pytest.approx(want, abs=1e-6)
    assert abs(mutant(beta) - want) > 1e-2, mutant.__name__


def test_the_clip_ratios_and_the_gradient_of_a_clipped_token():
    out = ours("dapo")
    # completion 0 (A > 0): token 0's w = 1.65 > 1.2; completion 1 (A < 0): token 1's
    # w = 0.61 < 0.8; w = 1.65 with A < 0 and w = 0.61 with A > 0 are not clipped
    assert out.clip_high.item() == pytest.approx(1 / 5)
    assert out.clip_low.item() == pytest.approx(1 / 5)
    assert out.clip_region.item() == pytest.approx(2 / 5)
    logps = LOGPS.clone().requires_grad_()
    grpo_loss(logps, OLD, None, ADV, MASK).loss.backward()
    # a clipped token gets no gradient; the others -A w / tokens; padding none
    w = torch.exp(LOGPS - OLD)
    want = -ADV[:, None] * w / 5 * MASK
    want[0, 0] = want[1, 1] = 0.0
    torch.testing.assert_close(logps.grad, want)


def test_on_policy_the_ratio_is_one_and_the_kl_is_zero_at_the_reference():
    out = grpo_loss(LOGPS, None, LOGPS, ADV, MASK, beta=1.0)
    assert out.kl.item() == 0.0 and out.clip_region.item() == 0.0
    # w = 1: the loss is minus the mean advantage of the tokens
    assert out.loss.item() == pytest.approx(-(3 * 1.0 + 2 * -1.0) / 5)
    assert (kl_k3(LOGPS, REF) >= 0).all()


def batch_normalised(rewards, group_size):
    """Advantages against the whole batch's mean and std, not each group's."""
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def no_zero_variance_guard(rewards, group_size):
    """Each group's std with no epsilon: 0 / 0 for a group of equal rewards."""
    grouped = rewards.view(-1, group_size)
    mean, std = grouped.mean(1, keepdim=True), grouped.std(1, keepdim=True)
    return ((grouped - mean) / std).view(-1)


def test_advantages_are_per_group_and_never_nan():
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 5.0, 6.0, 6.0, 6.0, 2.0, 2.0, 2.0, 2.0])
    got = group_advantages(rewards, 4)
    # each group by hand: mean 0.75 (5.75), unbiased std 0.5
    one = torch.tensor([-0.75, 0.25, 0.25, 0.25]) / (0.5 + 1e-4)
    torch.testing.assert_close(got, torch.cat([one, one, torch.zeros(4)]))
    assert not torch.allclose(batch_normalised(rewards, 4), got, atol=1e-2)
    assert no_zero_variance_guard(rewards, 4).isnan().any()
    assert not got.isnan().any() and (got[8:] == 0).all()
    # Dr. GRPO: the difference only, not divided by the std
    torch.testing.assert_close(
        group_advantages(rewards, 4, scale=False),
        torch.cat([one * (0.5 + 1e-4), one * (0.5 + 1e-4), torch.zeros(4)]),
    )
    # eight rewards of 0.3: their float32 mean is not exactly 0.3, and (r - mean) /
    # (std + 1e-4) would be 3e-4 (as TRL's is): smol's are exactly 0
    assert (group_advantages(torch.full((16,), 0.3), 8) == 0).all()


# --- bad inputs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "rewards, group_size, error, says",
    [
        ([1.0, 2.0, 3.0], 1, ValueError, "at least 2, got 1: a group of one"),
        ([1.0, 2.0, float("nan"), 0.0], 2, ValueError, "reward 2 is nan"),
        ([1.0, float("inf"), 3.0, 0.0], 2, ValueError, "reward 1 is inf"),
        ([1.0, 2.0, 3.0], 2, ValueError, "3 rewards do not split into groups of 2"),
        ([[1.0, 2.0]], 2, ValueError, "shape (N,), got (1, 2)"),
        ([1.0, 2.0], 2.0, TypeError, "group_size must be an int"),
    ],
)
def test_bad_rewards_are_named(rewards, group_size, error, says):
    with pytest.raises(error) as info:
        group_advantages(torch.tensor(rewards), group_size)
    assert says in str(info.value)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"completion_mask": MASK[:, :2]}, "tensors of one shape (B, T)"),
        ({"old_logps": OLD[:1]}, "'old_logps': (1, 3)"),
        ({"advantages": torch.ones(3)}, "advantages must have shape (B,) = (2,)"),
        ({"loss_type": "ppo"}, "loss_type must be one of"),
        ({"loss_type": "dr_grpo"}, "divides by max_completion_length"),
        ({"ref_logps": None, "beta": 0.1}, "needs ref_logps"),
        ({"importance_sampling_level": "word"}, "'token' or 'sequence'"),
    ],
)
def test_bad_loss_inputs_are_named(change, says):
    args = {
        "logps": LOGPS,
        "old_logps": OLD,
        "ref_logps": REF,
        "advantages": ADV,
        "completion_mask": MASK,
    }
    args.update(change)
    with pytest.raises(ValueError) as info:
        grpo_loss(**args)
    assert says in str(info.value)


def test_completion_logprobs_refuses_mismatched_rows():
    model = SmolLM(TINY)
    prompt, completion = torch.ones(2, 3, dtype=torch.long), torch.ones(3, 2).long()
    with pytest.raises(ValueError, match="2 prompts but 3 completions"):
        completion_logprobs(model, prompt, prompt, completion, completion)
    with pytest.raises(ValueError, match="completion_ids .* completion_mask"):
        completion_logprobs(model, prompt, prompt, completion, completion[:, :1])
    with pytest.raises(ValueError, match="temperature must be positive"):
        completion_logprobs(model, prompt, prompt, prompt, prompt, temperature=0)
