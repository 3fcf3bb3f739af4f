"""GRPO training: smol.grpo's loss on smol.train's Trainer. Each step draws a batch of
questions from a task's training split (smol.tasks), samples group_size replies to
each with the policy, scores every reply with reward functions, and trains on the
replies that beat their group's mean (Shao et al., 2024). The command is `smol grpo`
(smol/commands/grpo.py).

Each batch of scored replies is trained on for num_iterations steps (TRL's
num_iterations). The first step's replies come from the weights being trained, so
the old log-probabilities are the current ones, detached (the ratio is 1 in value
and no token is clipped); the later steps reuse them, and the ratio moves away from
1 as the weights do, which is where the clip binds. The sampler's random generator
and the batch under way (its replies, old and reference log-probabilities, and how
many of its steps are taken) are a checkpoint's data state, so a resumed run trains
on what an uninterrupted one would have, even when stopped within a batch."""

from __future__ import annotations

import dataclasses
import math
import time

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from smol import tasks, train_report
from smol.dpo import adapters_off
from smol.generate import FiniteLogits, generate
from smol.grpo import (
    LOSS_TYPES,
    GRPOLoss,
    completion_logprobs,
    group_advantages,
    grpo_loss,
)
from smol.grpo_rewards import Reward, check_rewards, score, task_rewards
from smol.sft import ConversationBatches
from smol.tasks import Problem
from smol.train import TrainConfig, Trainer

# what each step logs into the history, besides the loss
LOGGED = ("reward", "equal_groups", "kl", "clip_ratio", "completion_length")
TIMED = ("sample_s", "update_s")  # seconds spent sampling, and the rest of the step
# GRPOTrainer's keywords that from_options takes from the options that hold them
OPTIONS = (
    "group_size beta epsilon epsilon_high loss_type temperature max_new_tokens "
    "num_iterations"
)


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B, T) -> (B, T) long: 1 on each completion's tokens up to and including its
    first eos, 0 on the eos padding that generate writes after it."""
    is_eos = (completion_ids == eos_id).long()
    before = is_eos.cumsum(1) - is_eos  # (B, T): eos tokens strictly before
    return (before == 0).long()


@dataclasses.dataclass
class Rollout:
    """One batch of sampled replies, each prompt's group in consecutive rows."""

    problems: list[Problem]  # (P,) the questions
    prompt_ids: torch.Tensor  # (N, L) N = P * group_size, left-padded
    prompt_mask: torch.Tensor  # (N, L)
    completion_ids: torch.Tensor  # (N, T) eos after a reply's end
    completion_mask: torch.Tensor  # (N, T) 1 up to and including the first eos
    replies: list[str]  # (N,) the decoded replies
    rewards: torch.Tensor  # (N,)
    advantages: torch.Tensor  # (N,)
    # kept after the first update of a batch that num_iterations > 1 trains on again
    old_logps: torch.Tensor | None = None  # (N, T) the sampling policy's
    ref_logps: torch.Tensor | None = None  # (N, T) the reference's (beta > 0)


class ProblemBatches(ConversationBatches):
    """Endless batches of questions (lists of Problem) in a new random order each
    epoch. With num_iterations > 1 a step's grad_accum micro-batches are questions,
    whose Rollouts the trainer keeps in `replays`, and the next num_iterations - 1
    steps' are those Rollouts again. The state is the position, the sampler's
    generator, which draws the replies, and the replays."""

    def __init__(
        self, problems, batch_size, generator, num_iterations=1, grad_accum=1, **kw
    ):
        super().__init__(problems, batch_size, pad_id=0, **kw)
        self.generator, self.num_iterations = generator, num_iterations
        self.grad_accum = grad_accum
        self.served, self.replays = 0, []  # micro-batches served of this batch's

    def __next__(self):
        k = self.served
        self.served = (k + 1) % (self.grad_accum * self.num_iterations)
        if k >= self.grad_accum:
            return self.replays[k % self.grad_accum]
        self.replays = self.replays if k else []
        return super().__next__()

    def collate(self, picked: list) -> list[Problem]:
        return picked

    def state_dict(self) -> dict:
        # the batch under way, when its updates are not all taken
        replays = [dataclasses.asdict(r) for r in self.replays] if self.served else []
        return {
            **super().state_dict(),
            "sampler": self.generator.get_state(),
            "iterations": (self.num_iterations, self.served, replays),
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.generator.set_state(state["sampler"].cpu())
        saved, self.served, replays = state.get("iterations", (1, 0, []))
        if self.served and saved != self.num_iterations:
            raise ValueError(
                f"the checkpoint stopped within a batch trained on {saved} times; "
                f"num_iterations is now {self.num_iterations}"
            )
        device = self.generator.device
        self.replays = [
            Rollout(
                **{k: v.to(device) if torch.is_tensor(v) else v for k, v in r.items()}
                | {"problems": [Problem(**p) for p in r["problems"]]}
            )
            for r in replays
        ]


class GRPOTrainer(Trainer):
    """smol.train's Trainer with GRPO on a task of smol.tasks: `model` is the policy
    (with LoRA adapters only they train). `reference`: the frozen model of the KL
    term (beta > 0); None takes the policy with its adapters off. `rewards`: {name:
    (function, weight)} (default task_rewards()). epsilon clips the ratio below,
    epsilon_high above (default epsilon); loss_type is one of smol.grpo.LOSS_TYPES;
    scale_rewards divides advantages by the group's std (False: Dr. GRPO);
    num_iterations: the steps each batch of replies trains (the first on-policy). A
    prompt and its reply must fit in config.seq_len tokens."""

    def __init__(
        self,
        config: TrainConfig,
        model,
        tokenizer,
        task: str,
        *,
        group_size: int = 8,
        beta: float = 0.04,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        loss_type: str = "dapo",
        temperature: float = 1.0,
        max_new_tokens: int = 24,
        rewards: dict[str, tuple[Reward, float]] | None = None,
        reference: nn.Module | None = None,
        scale_rewards: bool = True,
        num_iterations: int = 1,
    ):
        _check_int("group_size", group_size, 2, "a group of one has no one to beat")
        _check_int("max_new_tokens", max_new_tokens, 1)
        _check_int("num_iterations", num_iterations, 1)
        epsilon_high = epsilon if epsilon_high is None else epsilon_high
        _check_number("epsilon", epsilon, 0)
        _check_number("epsilon_high", epsilon_high, 0)
        _check_number("temperature", temperature, 0)
        _check_number("beta", beta, 0, strict=False)
        if task not in tasks.TASKS:
            raise ValueError(
                f"unknown task {task!r}: expected one of {list(tasks.TASKS)}"
            )
        if loss_type not in LOSS_TYPES:
            raise ValueError(
                f"loss_type must be one of {list(LOSS_TYPES)}, got {loss_type!r}"
            )
        self.rewards = task_rewards() if rewards is None else check_rewards(rewards)
        if reference is None and beta > 0:
            with adapters_off(model):  # raises without adapters
                pass
        elif reference is not None and reference.config != model.config:
            raise ValueError(
                "the reference model's config differs from the policy's: the KL "
                "term compares the two on the same tokens"
            )
        self.group_size, self.max_new_tokens = group_size, max_new_tokens
        self.beta, self.epsilon, self.epsilon_high = beta, epsilon, epsilon_high
        self.loss_type, self.temperature = loss_type, temperature
        self.num_iterations = num_iterations
        self.scale_rewards, self.task, self.tokenizer = scale_rewards, task, tokenizer
        super().__init__(config, model=model)
        self.reference = reference
        if reference is not None:
            self.reference = reference.to(self.device).eval().requires_grad_(False)
        for name in (*LOGGED, *TIMED, "val_accuracy"):
            self.history.setdefault(name, [])
        # the most completion tokens a step samples (the progress bar's tokens/s)
        per_question = group_size * max_new_tokens * config.grad_accum
        self.tokens_per_step = config.batch_size * per_question
        self.last_rollout: Rollout | None = None
        self._logs: list[torch.Tensor] = []  # this step's micro-batches'
        self._pending_logs: list[tuple[torch.Tensor, float, float]] = []
        self._sample_s = 0.0

    def _load_data(self, train_tokens=None, val_tokens=None) -> None:
        cfg, tokenizer = self.cfg, self.tokenizer
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token: replies could not end")
        # every training question, in an order of the seed's; the batches reshuffle
        train, held_out = (len(tasks.pool(self.task, s)) for s in tasks.SPLITS)
        self.problems = tasks.problems(self.task, "train", train, cfg.seed)
        n = min(cfg.eval_batches * cfg.batch_size, held_out)
        self.held_out = tasks.problems(self.task, "held_out", n, cfg.seed)
        longest = max(len(self._prompt_ids(p)) for p in self.problems)
        if longest + self.max_new_tokens > cfg.seq_len:
            raise ValueError(
                f"the longest prompt of {self.task} ({longest} tokens) and "
                f"max_new_tokens {self.max_new_tokens} do not fit in seq_len "
                f"{cfg.seq_len}"
            )
        generator = torch.Generator(self.device).manual_seed(cfg.seed)
        self.train_batches = ProblemBatches(
            self.problems,
            cfg.batch_size,
            generator,
            self.num_iterations,
            grad_accum=cfg.grad_accum,
            seed=cfg.seed,
            rank=self.rank,
            world_size=self.world_size,
        )

    def _prompt_ids(self, problem: Problem) -> list[int]:
        return self.tokenizer.encode(
            self.tokenizer.apply_chat_template(problem.messages())
        )

    @torch.no_grad()
    def rollout(self, problems: list[Problem]) -> Rollout:
        """group_size sampled replies to each question, scored, with advantages."""
        G, eos = self.group_size, self.tokenizer.eos_token_id
        start = time.perf_counter()
        prompts = [self.tokenizer.apply_chat_template(p.messages()) for p in problems]
        ids, mask = self.tokenizer.batch_encode(prompts, device=self.device)  # (P, L)
        ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)  # (N, L)
        policy = FiniteLogits(self.model)  # the last step's weights, unchecked
        with self.autocast():
            out = generate(
                policy,
                ids,
                self.max_new_tokens,
                temperature=self.temperature,
                attention_mask=mask,
                eos_token_id=eos,
                generator=self.train_batches.generator,
            )  # (N, L + T)
        if policy.nonfinite:
            what = "a next-token logit of the policy"
            raise train_report.diverged(self, what, "NaN or inf", sampled=True)
        completion = out[:, ids.shape[1] :]  # (N, T)
        replies = self.tokenizer.batch_decode(completion.tolist(), True)
        self._sample_s += time.perf_counter() - start
        rows = [p for p in problems for _ in range(G)]
        rewards = score(self.rewards, rows, replies).to(self.device)  # (N,)
        advantages = group_advantages(rewards, G, self.scale_rewards)
        c_mask = completion_mask(completion, eos)
        return Rollout(
            problems, ids, mask, completion, c_mask, replies, rewards, advantages
        )

    def rollout_loss(self, model, rollout: Rollout, keep: bool = False) -> GRPOLoss:
        """GRPO's loss of a rollout, the policy run through `model` (the training
        wrapper of self.model, or self.model); the sampling policy's log-probabilities
        are the rollout's old_logps, or when None the policy's own, detached, which
        `keep` stores in the rollout (with the reference's) for the later updates."""
        r = rollout
        batch = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
        with self.autocast():
            logps = completion_logprobs(model, *batch, self.temperature)  # (N, T)
            ref = r.ref_logps
            if self.beta and ref is None:
                with torch.no_grad():
                    ref = self._reference_logprobs(batch)  # (N, T)
        if keep:
            r.old_logps, r.ref_logps = logps.detach(), ref
        return grpo_loss(
            logps,
            r.old_logps,  # None: the sampling policy is this one
            ref,
            r.advantages,
            r.completion_mask,
            loss_type=self.loss_type,
            epsilon_low=self.epsilon,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            max_completion_length=self.max_new_tokens,
        )

    def _reference_logprobs(self, batch) -> torch.Tensor:
        if self.reference is not None:
            return completion_logprobs(self.reference, *batch, self.temperature)
        with adapters_off(self.model):
            return completion_logprobs(self.model, *batch, self.temperature)

    def batch_loss(self, batch: list[Problem] | Rollout) -> torch.Tensor:
        """The loss of new questions, or of a batch's kept Rollout once more."""
        fresh = not isinstance(batch, Rollout)
        rollout = self.rollout(batch) if fresh else batch
        keep = fresh and self.num_iterations > 1
        out = self.rollout_loss(self.train_model, rollout, keep)
        if keep:
            self.train_batches.replays.append(rollout)
        self.last_rollout = rollout
        groups = rollout.rewards.view(-1, self.group_size)  # (P, G)
        equal = (groups == groups[:, :1]).all(1).float().mean()
        length = rollout.completion_mask.sum(1).float().mean()
        logs = (rollout.rewards.mean(), equal, out.kl, out.clip_region, length)
        self._logs.append(torch.stack([t.float() for t in logs]))
        return out.loss

    def train_step(self) -> torch.Tensor:
        start, self._sample_s = time.perf_counter(), 0.0
        loss = super().train_step()
        logs = torch.stack(self._logs).mean(0)  # (5,) over micro-batches
        self._logs = []
        if self.world_size > 1:
            dist.all_reduce(logs)
            logs /= self.world_size
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        spent = time.perf_counter() - start
        self._pending_logs.append((logs, self._sample_s, spent - self._sample_s))
        return loss

    def _read_back(self, pending, due, caught) -> bool:
        logged = [logs.tolist() for logs, _, _ in self._pending_logs]
        for (step, _, _), values in zip(pending, logged):
            kl, what = values[LOGGED.index("kl")], "the KL term to the reference"
            if self.beta and not math.isfinite(kl):  # exp overflows far from it
                causes = {"lr": self.cfg.lr, "beta": self.beta}
                raise train_report.diverged(self, what, kl, step, **causes)
        stop = super()._read_back(pending, due, caught)
        for (_, sample_s, update_s), values in zip(self._pending_logs, logged):
            for name, value in zip(LOGGED, values):
                self.history[name].append(value)
            self.history["sample_s"].append(sample_s)
            self.history["update_s"].append(update_s)
        self._pending_logs = []
        if self.is_main and self.cfg.progress:
            h = self.history
            tqdm.write(
                f"step {self.step}: reward {h['reward'][-1]:.3f}, equal groups "
                f"{h['equal_groups'][-1]:.2f}, kl {h['kl'][-1]:.4f}, reply length "
                f"{h['completion_length'][-1]:.1f}, sampling "
                f"{h['sample_s'][-1]:.1f} s, update {h['update_s'][-1]:.1f} s"
            )
        return stop

    @torch.no_grad()
    def evaluate(self) -> float:
        """The share of the held-out questions (eval_batches * batch_size of them, the
        same each time) whose greedy reply is wrong: the run's validation loss; the
        accuracy goes into history["val_accuracy"]."""
        replies = tasks.answer(
            self.model,
            self.tokenizer,
            self.held_out,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.cfg.batch_size * self.group_size,
        )
        right = [tasks.check(r[0], p.answer) for p, r in zip(self.held_out, replies)]
        accuracy = sum(right) / len(right)
        self.history["val_accuracy"].append(accuracy)
        return 1.0 - accuracy


def from_options(config, model, tokenizer, args, reference=None) -> GRPOTrainer:
    """The GRPOTrainer of parsed options: task, task_rewards(format_weight), OPTIONS."""
    kept = {k: getattr(args, k) for k in OPTIONS.split() if hasattr(args, k)}
    kept["rewards"] = task_rewards(args.format_weight)
    return GRPOTrainer(config, model, tokenizer, args.task, reference=reference, **kept)


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(name: str, value, least: float, strict: bool = True) -> None:
    ok = _real(value) and math.isfinite(value)
    if not (ok and (value > least if strict else value >= least)):
        sign = ">" if strict else ">="
        raise ValueError(
            f"{name} must be a finite number {sign} {least}, got {value!r}"
        )


def _check_int(name: str, value, least: int, why: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        why = f": {why}" if why else ""
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}{why}")
