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

import pytest
import torch

from smol import SmolLM
from smol.grpo import (
    LOSS_TYPES,
    completion_logprobs,
    group_advantages,
    grpo_loss,
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
