"""16 GRPO: the clipped objective with its KL penalty (the GRPO paper's: smol.grpo's
use_bias_correction_kl=False), averaged over the completion tokens.

Each check's inputs keep the other checks' bugs out of sight (the averaging: ratios
inside the clipping range, beta 0; the clipping and the KL: no padding, so that
every averaging agrees; padding: completions of one length), so that a bug loses the
points of the check written for it."""

import torch

from smol.grading.checks._util import close, is_tensor, untouched
from smol.grading.registry import probe_check, task

task(
    "grpo_loss",
    "grpo",
    "grpo_loss(logps, old_logps, ref_logps, advantages, completion_mask, ...): the "
    "clipped objective with its KL penalty",
)

TENSORS = ("logps", "old_logps", "ref_logps", "advantages", "completion_mask")
DEFAULTS = {"loss_type": "grpo", "beta": 0.0, "epsilon_low": 0.2, "epsilon_high": 0.2}
OPTIONS = tuple(DEFAULTS)


def _batch(B, T, log_ratio, lengths=None, padding="zero", kl_spread=0.0, **options):
    """B completions of T token slots: log-probabilities under the policy (logps),
    the sampling policy (logps - log-ratios: each row's T evenly spaced in log_ratio
    (lo, hi), in a random order) and the reference (logps + noise of std kl_spread),
    an advantage per completion (a 0 among them, as equal rewards give) and the mask
    of each completion's `lengths` tokens. padding "zero": 0 after a completion's end
    in all three, as smol.grpo.completion_logprobs writes them; "any": a model's
    numbers there (TRL's), -100 to -120 in logps or in old_logps by turns (exp of
    ref - logp or of logp - old overflows to inf, and inf * 0 is NaN), the reference
    then equal to the policy on the real tokens. options: the loss's (OPTIONS), and
    dtype."""
    options = DEFAULTS | options
    dtype = options.pop("dtype", torch.float32)
    lengths = [T] * B if lengths is None else lengths
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    logps = -torch.rand(B, T) * 4 - 0.1
    grid = torch.linspace(*log_ratio, T)
    ratio = torch.stack([grid[torch.randperm(T)] for _ in range(B)])
    old = logps - ratio
    ref = logps + torch.randn(B, T) * kl_spread
    real = mask.bool()
    if padding == "zero":
        logps, old, ref = (x.masked_fill(~real, 0.0) for x in (logps, old, ref))
    else:  # anything at the padding: a model's numbers, some of them unlikely
        near, far = -torch.rand(3, B, T) * 3, -100 - torch.rand(B, T) * 20
        odd = torch.arange(T) % 2 == 1  # logps far (exp(ref - logp) overflows) ...
        logps = torch.where(real, logps, torch.where(odd, far, near[0]))
        ref = torch.where(real, logps, near[1])
        old = torch.where(real, old, torch.where(odd, near[2], far))  # ... or w does
    advantages = torch.randn(B)  # both signs, and a 0 last where B > 2
    advantages[:2] = torch.tensor([1.0, -1.0]) * advantages[:2].abs().clamp(min=0.3)
    if B > 2:
        advantages[-1] = 0.0
    out = {"logps": logps, "old_logps": old, "ref_logps": ref, "advantages": advantages}
    return (
        {k: v.to(dtype) for k, v in out.items()} | {"completion_mask": mask} | options
    )


INSIDE = (-0.14, 0.14)  # ratios 0.87 to 1.15: inside [0.8, 1.2], never clipped


def _loss_reference(c: dict, logps: torch.Tensor | None = None) -> torch.Tensor:
    """smol's loss of the case, in float32 (logps: a leaf to take gradients of)."""
    from smol.grpo import grpo_loss

    x = {k: c[k].float() if k != "completion_mask" else c[k] for k in TENSORS}
    if logps is not None:
        x["logps"] = logps
    T = c["logps"].shape[1]
    options = {k: c[k] for k in OPTIONS} | {"max_completion_length": T}
    tensors = [x[k] for k in TENSORS]
    return grpo_loss(*tensors, **options, use_bias_correction_kl=False).loss


def _what_batch(c: dict) -> str:
    B, T = c["logps"].shape
    lengths = c["completion_mask"].sum(1).tolist()
    dtype = str(c["logps"].dtype).removeprefix("torch.")
    eps = f"eps=({c['epsilon_low']}, {c['epsilon_high']}), {dtype}"
    return f"{c['loss_type']}, B={B}, T={T}, lengths {lengths}, beta={c['beta']}, {eps}"


def _call_loss(fn, c: dict, grad: bool = False) -> dict:
    """Probe side: the student's loss, the inputs after the call and, with grad, the
    gradient the loss sends to logps (given as a model's output, not a leaf)."""
    given = {k: c[k] for k in TENSORS}
    if grad:
        leaf = c["logps"].clone().requires_grad_(True)
        given["logps"] = leaf.clone()
    out = fn(*(given[k] for k in TENSORS), **{k: c[k] for k in OPTIONS})
    loss = is_tensor(getattr(out, "loss", out), "the loss")
    result = {"loss": loss, "after": {k: c[k] for k in TENSORS}}  # given, or clones
    if grad:
        assert loss.requires_grad, "the loss is not connected to logps' graph"
        loss.sum().backward()
        result["grad"] = leaf.grad
    return result


def _judge_loss(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        loss = is_tensor(out["loss"], "the loss")
        assert loss.numel() == 1, f"the loss has shape {tuple(loss.shape)}: one number"
        tol = 3e-2 if c["logps"].dtype == torch.bfloat16 else 1e-5
        want = _loss_reference(c)
        close(loss.reshape(()), want, f"the loss ({_what_batch(c)})", tol, tol)


def _judge_grad(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        assert out["grad"] is not None, f"{_what_batch(c)}: no gradient reached logps"
        leaf = c["logps"].clone().requires_grad_(True)
        _loss_reference(c, leaf).backward()
        close(out["grad"], leaf.grad, f"the gradient of logps ({_what_batch(c)})")


def _judge_inputs_kept(inputs, outputs) -> None:
    for c, out, k in ((c, out, k) for c, out in zip(inputs, outputs) for k in TENSORS):
        untouched(out["after"][k], c[k], f"{k} ({_what_batch(c)})")


def _averaging_cases():
    """Completions of unequal lengths, padded with 0, each averaging; ratios inside
    the clipping range, beta 0; as many completions as token slots (where advantages
    broadcast along the tokens run, to be caught by their values), bfloat16, and
    none of T's length (dr_grpo's T is the padded length, not the longest's)."""
    cases = [_batch(4, 7, INSIDE, [5, 3, 1, 4], loss_type="dr_grpo")]
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        cases.append(_batch(4, 6, INSIDE, [6, 3, 1, 5], loss_type=loss_type))
        cases.append(_batch(5, 5, INSIDE, [2, 5, 4, 1, 3], loss_type=loss_type))
    return cases + [_batch(3, 7, INSIDE, [7, 2, 4], dtype=torch.bfloat16)]  # grpo


def _padding_cases():
    """Completions of one length, followed by padding that holds a model's numbers
    (under the reference too), beta > 0: every averaging but Dr. GRPO's constant
    agrees on them, and only padding changes the KL."""
    return [
        _batch(3, 6, INSIDE, [4, 4, 4], padding="any", loss_type=t, beta=b)
        for t, b in (("grpo", 0.0), ("dapo", 0.0), ("grpo", 0.5), ("dapo", 0.1))
    ]


def _clip_cases():
    """Ratios from 0.41 to 2.46 on both sides of [1 - eps, 1 + eps], advantages of
    both signs, every completion full length (every averaging agrees), beta 0."""
    shapes = ((4, 8, "grpo"), (6, 5, "dapo"), (3, 6, "dr_grpo"))
    return [_batch(B, T, (-0.9, 0.9), loss_type=t) for B, T, t in shapes]


def _asymmetric_cases():
    """eps_low != eps_high, ratios where only the range of one epsilon for both
    sides would clip: 0.92 to 1.26 for (0.1, 0.28), 0.74 to 1.07 for (0.3, 0.1)."""
    return [
        _batch(
            6, 8, (-0.08, 0.23), epsilon_low=0.1, epsilon_high=0.28, loss_type="dapo"
        ),
        _batch(6, 8, (-0.3, 0.07), epsilon_low=0.3, epsilon_high=0.1),
    ]


def _kl_cases():
    """beta > 0 with the reference away from the policy (log-ratios of std 0.7),
    ratios inside the clipping range, every completion full length; and, where every
    advantage is 0 (the KL term alone), its gradient."""
    cases = [
        _batch(4, 6, INSIDE, kl_spread=0.7, loss_type=t, beta=b)
        for t, b in (("grpo", 0.04), ("dapo", 0.5), ("dr_grpo", 1.0))
    ]
    for t, b in (("grpo", 0.1), ("dapo", 1.0)):
        c = _batch(3, 5, INSIDE, kl_spread=0.7, loss_type=t, beta=b)
        cases.append(c | {"advantages": torch.zeros(3), "grad": True})
    return cases


def _judge_kl(inputs, outputs) -> None:
    _judge_loss(inputs, outputs)
    graded = [(c, out) for c, out in zip(inputs, outputs) if c.get("grad")]
    _judge_grad([c for c, _ in graded], [out for _, out in graded])


def _unlikely_cases():
    """Every log-probability near -110 (a completion of unlikely tokens: exp of one
    is 0 in float32, exp of a difference is not), full length, ratios inside the
    clipping range; beta 0, beta > 0 with the reference equal to the policy (every
    KL term 0, unless computed as exp(ref) / exp(logp)), and beta 0 with zeros for
    the reference (none is run at beta 0): there exp(ref - logp) overflows, and a KL
    term kept as 0 * inf is NaN."""
    cases = [
        _batch(4, 6, INSIDE, loss_type=t, beta=b)
        for t, b in (("grpo", 0.0), ("dapo", 0.1), ("dapo", 0.0))
    ]
    cases = [c | {k: c[k] - 110 for k in TENSORS[:3]} for c in cases]
    cases[-1]["ref_logps"] = torch.zeros_like(cases[-1]["ref_logps"])
    return cases


def _grad_cases():
    """Full-length completions, ratios inside the clipping range, beta 0."""
    return [
        _batch(3, 5, INSIDE, loss_type="grpo"),
        _batch(4, 4, INSIDE, loss_type="dapo"),
    ]


def _kept_cases():
    """Unequal lengths, a model's numbers in the padding, beta > 0."""
    return [
        _batch(4, 6, INSIDE, [6, 2, 4, 3], padding="any", beta=0.1),
        _batch(3, 5, INSIDE, [1, 5, 3], loss_type="dapo", padding="any"),
    ]


for name, points, hint, make, grad, judge in (
    (
        "grpo, dapo, dr_grpo: the mean per completion, per token, over B * T",
        2,
        "grpo: each completion's sum over its real tokens / its length, then the "
        "mean over completions; dapo: the sum over every real token / their count; "
        "dr_grpo: that sum / (B * T), T = logps.shape[1] even where no completion "
        "is that long; a token's loss times completion_mask, and lengths from "
        "completion_mask.sum(-1)",
        _averaging_cases,
        False,
        _judge_loss,
    ),
    (
        "padding (completion_mask 0) counts nothing, whatever it holds",
        1,
        "count only the real tokens (.mean() over the (B, T) slots counts the "
        "padding), and zero the padding of the three log-probability tensors first "
        "(x.masked_fill(completion_mask == 0, 0.0)): there exp(ref - logp) or "
        "exp(logp - old) can overflow to inf, and inf * 0 is NaN",
        _padding_cases,
        False,
        _judge_loss,
    ),
    (
        "clipped: -min(w * A, clip(w, 1 - eps_low, 1 + eps_high) * A)",
        2,
        "the objective is the smaller (pessimistic) of the unclipped and the clipped "
        "one, for either sign of A: torch.min(ratio * A, clipped * A), then the "
        "minus; torch.min(-ratio * A, -clipped * A) is the larger objective",
        _clip_cases,
        False,
        _judge_loss,
    ),
    (
        "asymmetric clipping: 1 - eps_low below, 1 + eps_high above",
        1,
        "torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high): each epsilon on its "
        "own side (DAPO's clip-higher raises eps_high alone)",
        _asymmetric_cases,
        False,
        _judge_loss,
    ),
    (
        "beta > 0: plus beta * (exp(ref - logp) - (ref - logp) - 1) a token",
        2,
        "k3 with d = ref_logps - logps, not logps - ref_logps: exp(d) - d - 1, added "
        "to each token's loss times beta (not weighed by the ratio here), computed "
        "from logps inside the graph",
        _kl_cases,
        False,
        _judge_kl,
    ),
    (
        "log-probabilities near -110 (unlikely tokens): exp of differences, in the "
        "ratio and the KL, not exp(logps) / exp(old_logps)",
        1,
        "exp(-110) is 0 in float32 (and bfloat16), and 0 / 0 is NaN: take the "
        "difference first, torch.exp(logps - old_logps) for the ratio and "
        "torch.exp(ref_logps - logps) for the KL; at beta 0 leave the KL term out "
        "(if beta: ...): 0 * inf is NaN",
        _unlikely_cases,
        False,
        _judge_loss,
    ),
    (
        "the gradient reaches logps through the ratio",
        1,
        "compute the ratio as torch.exp(logps - old_logps) inside the graph: no "
        ".detach() of logps, no torch.no_grad(), no .item()",
        _grad_cases,
        True,
        _judge_grad,
    ),
    (
        "the five input tensors are left unchanged",
        1,
        "logps * mask or torch.where(...) makes a new tensor; masked_fill_, mul_ or "
        "+= on an input (or on a view of it) writes into the caller's",
        _kept_cases,
        False,
        _judge_inputs_kept,
    ),
):

    @probe_check("grpo_loss", name, points, hint, inputs=make, judge=judge)
    def _(fn, inputs, grad=grad):
        return [_call_loss(fn, c, grad or c.get("grad", False)) for c in inputs]
