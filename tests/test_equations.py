"""The book's equations against the functions they describe.

Each test names an equation by the LaTeX a chapter prints (so that an edit of the
equation fails here until the test is read again), writes it out term by term in plain
torch or math, independently of smol, and compares it with smol's function on random
inputs. Each also keeps a wrong transcription (a mutant) and shows the comparison
rejecting it, so the comparison can fail."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from smol.dpo import dpo_loss
from smol.optim import lr_schedule

ROOT = Path(__file__).resolve().parents[1]


def markdown(chapter: str) -> str:
    """A chapter's markdown cells, joined, without white space (LaTeX ignores it)."""
    nb = json.loads((ROOT / "chapters" / f"{chapter}.ipynb").read_text())
    text = "\n".join(
        "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"
    )
    return "".join(text.split())


def printed(chapter: str, latex: str) -> None:
    assert "".join(latex.split()) in markdown(chapter), (
        f"{chapter} no longer prints {latex!r}: read the test again"
    )


# -- chapter 10: the learning-rate schedule ----------------------------------------

WARMUP = r"\eta_s = \eta_\text{max}\,\frac{s + 1}{W}"
COSINE = (
    r"\eta_s = {} & \eta_\text{min} + \frac{\eta_\text{max} - \eta_\text{min}}{2} \\"
    r"& \times \Big(1 + \cos \frac{\pi\,(s - W)}{S - W}\Big)"
)
WSD = (
    r"\eta_s = \eta_\text{max} + (\eta_\text{min} - \eta_\text{max})\,"
    r"\frac{s - D}{S - D}"
)


def schedule_as_printed(s, *, W, S, lo, hi, kind, f=0.2, warmup_plus_one=True):
    if s < W:
        return hi * ((s + 1) if warmup_plus_one else s) / W
    if s >= S:
        return lo
    if kind == "cosine":
        return lo + (hi - lo) / 2 * (1 + math.cos(math.pi * (s - W) / (S - W)))
    D = max(W, S - round(f * S))  # the decay's first step
    return hi if s < D else hi + (lo - hi) * (s - D) / (S - D)


SCHEDULES = [
    dict(W=10, S=100, lo=3e-4, hi=3e-3),
    dict(W=1, S=7, lo=0.0, hi=1.0),
    dict(W=0, S=50, lo=1e-5, hi=1e-3),
    dict(W=30, S=31, lo=0.5, hi=2.0),
]


@pytest.mark.parametrize("kind", ["cosine", "wsd"])
def test_the_printed_schedule_is_lr_schedule(kind):
    for latex in (WARMUP, COSINE if kind == "cosine" else WSD):
        printed("10_training", latex)
    for p in SCHEDULES:
        for s in range(p["S"] + 3):
            want = schedule_as_printed(s, kind=kind, **p)
            got = lr_schedule(
                s,
                max_lr=p["hi"],
                warmup_steps=p["W"],
                total_steps=p["S"],
                min_lr=p["lo"],
                kind=kind,
            )
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (kind, p, s)


def test_a_warmup_from_zero_differs_from_lr_schedule():
    """The mutant: a warmup of s / W starts at 0, a step the optimizer wastes."""
    p = SCHEDULES[0]
    wrong = schedule_as_printed(0, kind="cosine", warmup_plus_one=False, **p)
    right = lr_schedule(
        0, max_lr=p["hi"], warmup_steps=p["W"], total_steps=p["S"], min_lr=p["lo"]
    )
    assert wrong != pytest.approx(right)


# -- chapter 10: gradient clipping -------------------------------------------------

CLIP = r"g \leftarrow g \cdot \min\big(1, c / (\lVert g \rVert + 10^{-6})\big)"


def test_the_printed_clip_is_clip_grad_norm():
    printed("10_training", CLIP)
    torch.manual_seed(0)
    for scale, c in [(1e-3, 1.0), (10.0, 1.0), (1.0, 0.5), (1e-7, 1e-6)]:
        grads = [scale * torch.randn(5, 3, dtype=torch.float64) for _ in range(3)]
        params = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        torch.nn.utils.clip_grad_norm_(params, max_norm=c)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, c / (norm.item() + 1e-6))
        for p, g in zip(params, grads):
            torch.testing.assert_close(p.grad, g * factor, rtol=1e-12, atol=0)
        # the mutant without the 1e-6 differs where the norm is that small
        if scale == 1e-7:
            assert not torch.allclose(p.grad, g * min(1.0, c / norm.item()))


# -- chapter 15: DPO -----------------------------------------------------------------

DPO = (
    r"\mathcal{L}_\text{DPO} &= -\log \sigma\big(\beta\, m\big),\\ "
    r"m &= h(y_w) - h(y_l),\\ "
    r"h(y) &= \log \pi(y \mid x) - \log \pi_\text{ref}(y \mid x)."
)
DPO_GRADIENT = (
    r"\nabla h(y) = \nabla \log \pi(y \mid x)",  # the reference is frozen
    r"-\beta\,\sigma(-\beta m)\,\big(\nabla h(y_w) - \nabla h(y_l)\big)",
)
IDENTITY = (
    r"\mathbb{E}_{y \sim \pi}\big[r(x, y)\big] - \beta\, \mathrm{KL}\big(\pi\,\|\,"
    r"\pi_\text{ref}\big)\\ &\quad = \beta \log Z(x) - \beta\, "
    r"\mathrm{KL}\big(\pi\,\|\,\pi^*\big)"
)


def dpo_as_printed(pw, pl, rw, rl, beta, swap=False):
    h_w, h_l = pw - rw, pl - rl  # h(y) = log pi(y | x) - log pi_ref(y | x)
    m = h_w - h_l
    if swap:
        m = -m
    return (-torch.log(torch.sigmoid(beta * m))).mean()  # the mean over pairs


def frozen(loss, tensors) -> bool:
    """Does no gradient of `loss` reach `tensors`?"""
    grads = torch.autograd.grad(loss, tensors, retain_graph=True, allow_unused=True)
    return all(g is None or not g.any() for g in grads)


def test_the_printed_dpo_loss_and_its_gradient_are_dpo_loss():
    printed("15_preference_tuning", DPO)
    for latex in DPO_GRADIENT:
        printed("15_preference_tuning", latex)
    g = torch.Generator().manual_seed(0)
    for beta in (0.01, 0.1, 1.0, 5.0):
        pw, pl, rw, rl = (
            (-30 * torch.rand(8, generator=g, dtype=torch.float64)).requires_grad_()
            for _ in range(4)
        )
        got = dpo_loss(pw, pl, rw, rl, beta=beta)
        want = dpo_as_printed(pw, pl, rw, rl, beta)
        torch.testing.assert_close(got.loss, want, rtol=1e-12, atol=1e-12)
        wrong = dpo_as_printed(pw, pl, rw, rl, beta, swap=True)
        assert not torch.allclose(got.loss, wrong)
        # the reference is frozen: no gradient reaches it, so grad h = grad log pi;
        # the mutant that lets the reference's log-probabilities carry a gradient
        # (no detach, as dpo_as_printed writes it) is caught
        assert frozen(got.loss, (rw, rl))
        assert not frozen(dpo_as_printed(pw, pl, rw, rl, beta), (rw, rl))
        # the printed gradient, per pair, over the mean's B pairs
        (grad_w, grad_l) = torch.autograd.grad(got.loss, (pw, pl))
        m = (pw - rw) - (pl - rl)
        weight = beta * torch.sigmoid(-beta * m) / len(m)
        torch.testing.assert_close(grad_w, -weight.detach(), rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(grad_l, weight.detach(), rtol=1e-10, atol=1e-14)


def test_the_printed_identity_behind_dpo_s_closed_form():
    """Step 2's identity: the objective is beta log Z minus beta times the KL to pi*,
    for every policy pi; so pi* maximises it, and nothing else reaches the maximum."""
    printed("15_preference_tuning", IDENTITY)
    g = torch.Generator().manual_seed(1)
    for beta in (0.1, 1.0, 3.0):
        ref = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
        r = torch.randn(6, generator=g, dtype=torch.float64)
        Z = (ref * torch.exp(r / beta)).sum()
        best = ref * torch.exp(r / beta) / Z
        for pi in [best] + [
            torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
            for _ in range(5)
        ]:
            kl = lambda p, q: (p * (p / q).log()).sum()  # noqa: E731
            objective = (pi * r).sum() - beta * kl(pi, ref)
            torch.testing.assert_close(
                objective, beta * Z.log() - beta * kl(pi, best), rtol=0, atol=1e-12
            )
            # the mutant: Z left out of the identity
            assert not torch.isclose(objective, -beta * kl(pi, best), atol=1e-6)


def test_dpo_loss_is_logsigmoid_not_a_hinge():
    """A margin ranked right still costs a little: -log sigma(x) > 0 for every x,
    where a hinge loss would be exactly 0 (the mutant)."""
    zero = torch.zeros(1, dtype=torch.float64)
    out = dpo_loss(zero + 5.0, zero, zero, zero, beta=1.0).loss
    assert 0 < out.item() == pytest.approx(-F.logsigmoid(torch.tensor(5.0)).item())


# -- chapter 16: GRPO ----------------------------------------------------------------

GRPO_TOKEN_LOSS = (
    r"w_{i,t} &= \frac{\pi_\theta(o_{i,t} \mid q, o_{i,<t})}"
    r"{\pi_\text{old}(o_{i,t} \mid q, o_{i,<t})},\\"
    r"c_{i,t} &= \operatorname{clip}(w_{i,t},\ 1 - \epsilon,\ 1 + \epsilon),\\"
    r"\ell_{i,t} &= -\min\big(w_{i,t} A_i,\ c_{i,t} A_i\big) \\"
    r"&\quad + \beta\, w_{i,t}\, \mathrm{KL}_{i,t}."
)


def test_the_printed_grpo_loss_is_the_one_tests_write_out():
    """Chapter 16 prints the token loss that tests/test_grpo_formula.py's `printed`
    writes out term by term and compares with grpo_loss for every loss_type: the ratio
    w, its clip c, and the KL term weighed by w."""
    printed("16_learning_from_rewards", GRPO_TOKEN_LOSS)
    from tests.test_grpo_formula import printed as written_out

    # the written-out loss weighs the KL term by w unless told otherwise, as printed
    assert written_out.__defaults__ == (True,)
