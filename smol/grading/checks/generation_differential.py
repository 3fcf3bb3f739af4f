"""08 KV-cache generation, the filters and the attention mask against smol's on
generated inputs (`_differential`). filter_top_k: -inf already in a row, k from 1 to
beyond V, logits from -190 to 200, float32, bfloat16 and float16. filter_top_p: p
from 0 to 1, logits up to 250 (exp overflows in float32), -inf in a row, float32,
bfloat16 and float16. Every value of a row distinct, p well away from a boundary:
ties and float sums leave what is kept to the sort and the sum's order. The mask:
padding on the left, the right, between tokens and whole rows of it, masks of
bool, int and float, cached tokens before the queries; what real queries see, and that
every query sees something, compared. greedy_generate runs a model: its targeted
checks compare its tokens with smol's decoding."""

import torch

from smol.generate import filter_top_k, filter_top_p
from smol.grading.checks import _differential as diff
from smol.grading.checks.attention_mask import _reference_mask

NAME = "generated inputs: values and dtypes equal smol's"
CASES = 40
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
NEG = float("-inf")


def _hide(g, x: torch.Tensor) -> torch.Tensor:
    """x with -inf at about a fifth of its places, never at a row's first."""
    hidden = torch.rand(x.shape, generator=g) < 0.2
    hidden[..., 0] = False
    return x.masked_fill(hidden, NEG)


def _shown(x: torch.Tensor) -> str:
    """The logits as a hint shows them: their values where few, else their shape."""
    held = x.tolist() if x.numel() <= 26 else f"of shape {tuple(x.shape)}"
    return f"logits {held} ({diff.dtype_name(x)})"


def _distinct(g, B: int, V: int, step: float, top: float) -> torch.Tensor:
    """(B, V) logits: each row a permutation of top, top - step, ..., so that no two
    tie (ties make the kept set a matter of the sort's order), in every dtype."""
    ranks = torch.stack([torch.randperm(V, generator=g) for _ in range(B)])
    return top - step * ranks.float()


def _top_k_case(g) -> dict:
    B, V = diff.pick(g, (1, 2, 4)), diff.pick(g, (1, 2, 5, 13, 40))
    k = int(torch.randint(1, V + 3, (), generator=g))
    step, top = diff.pick(g, ((0.25, 0.0), (3.0, 200.0), (1.0, -150.0)))
    x = _distinct(g, B, V, step, top)
    if torch.rand((), generator=g) < 0.4:
        x = _hide(g, x)
    x = x.to(diff.pick(g, DTYPES))
    return diff.exact(f"{_shown(x)}, k={k}", {"logits": x, "arg": k})


def _top_p_case(g) -> dict:
    """Rows that are permutations of the same values (the same -inf among them): one
    sorted distribution, and p halfway between two of its cumulative masses, at
    least 0.02 from each, or 0 or 1: a float32 or bfloat16 sum keeps the same
    tokens."""
    B, V = diff.pick(g, (1, 2, 4)), diff.pick(g, (1, 2, 5, 13, 40))
    step, top = diff.pick(g, ((0.1, 0.0), (0.5, 2.0), (2.0, 250.0)))
    x = _distinct(g, B, V, step, top)
    hidden = int(torch.randint(0, V, (), generator=g)) // 2  # the smallest few
    x = x.masked_fill(x < top - step * (V - 1 - hidden) - step / 2, NEG)
    x = x.to(diff.pick(g, DTYPES))
    probs = x[0].double().sort(descending=True).values.softmax(-1)
    mass = probs.cumsum(-1)
    between = [
        float(mass[i] + probs[i + 1] / 2) for i in range(V - 1) if probs[i + 1] >= 0.04
    ]
    ends = [0.0, 1.0] if step < 0.5 else [0.0]  # p = 1: no probability underflows
    p = round(diff.pick(g, ends + between * 2), 6) if between else diff.pick(g, ends)
    return diff.exact(f"{_shown(x)}, p={p}", {"logits": x, "arg": p})


def _call_filter(fn, args):
    return [fn(args["logits"].clone(), args["arg"])]


def padding_row(g, n: int) -> torch.Tensor:
    """(n,) long 0/1: padding on the left, the right, between tokens (a 0 between
    two 1s where n >= 3), none, or only padding."""
    kind = diff.pick(g, ("left", "right", "gaps", "none", "all"))
    k = int(torch.randint(0, n + 1, (), generator=g))
    row = torch.ones(n, dtype=torch.long)
    if kind == "left":
        row[:k] = 0
    elif kind == "right":
        row[n - k :] = 0
    elif kind == "gaps":  # packed or masked data
        row = (torch.rand(n, generator=g) < 0.6).long()
        if n >= 3:
            j = int(torch.randint(1, n - 1, (), generator=g))
            row[j - 1 : j + 2] = torch.tensor([1, 0, 1])
    elif kind == "all":
        row[:] = 0
    return row


def _mask_case(g) -> dict:
    T, offset = diff.pick(g, (1, 2, 5)), diff.pick(g, (0, 0, 1, 4))
    Tk = offset + T
    if torch.rand((), generator=g) < 0.2:
        return diff.exact(
            f"no padding mask, T={T}, offset={offset}",
            {"mask": None, "T": T, "offset": offset},
        )
    B = diff.pick(g, (1, 2, 4))
    rows = [padding_row(g, Tk) for _ in range(B)]
    mask = torch.stack(rows).to(
        diff.pick(g, (torch.long, torch.bool, torch.int32, torch.float32))
    )
    what = (
        f"attention_mask {mask.int().tolist()} ({diff.dtype_name(mask)}), T={T}, "
        f"offset={offset}"
    )
    return diff.exact(what, {"mask": mask, "T": T, "offset": offset})


def _call_mask(fn, args):
    """What a real query sees, (B, 1, T, offset + T) (a padding query's row is
    anyone's choice: its output is never used), and whether each query sees a key
    (B, 1, T): a row of none is NaN after softmax."""
    mask, T, offset = args["mask"], args["T"], args["offset"]
    B = 1 if mask is None else mask.shape[0]
    out = fn(mask, T, offset)
    seen = out.expand(B, 1, T, offset + T)
    real = (
        torch.ones(B, T, dtype=torch.bool) if mask is None else mask[:, offset:].bool()
    )
    return [seen & real[:, None, :, None], seen.any(-1)]


def _smol_mask():
    return _reference_mask


for task, make, call, reference, hint in (
    (
        "filter_top_k",
        _top_k_case,
        _call_filter,
        lambda: filter_top_k,
        "the case named below differs from smol.generate.filter_top_k: keep every "
        "logit >= the k-th largest, the rest -inf, in the logits' dtype, whatever "
        "their range and -inf already among them",
    ),
    (
        "filter_top_p",
        _top_p_case,
        _call_filter,
        lambda: filter_top_p,
        "the case named below differs from smol.generate.filter_top_p: softmax of "
        "the float32 sorted logits (it subtracts the maximum: exp(250) is inf), the "
        "mass before a token >= p removes it, the first one never; -inf stays "
        "-inf; in the logits' dtype",
    ),
    (
        "attention_mask_bug",
        _mask_case,
        _call_mask,
        _smol_mask,
        "the case named below differs from smol's mask: a real query at position "
        "offset + i sees the keys up to itself that are not padding, wherever the "
        "padding stands (left, right, between tokens); every query sees at least "
        "itself; a bool mask of any 0/1 attention_mask dtype",
    ),
):
    diff.register(task, NAME, 1, hint, make, call, reference, CASES)
