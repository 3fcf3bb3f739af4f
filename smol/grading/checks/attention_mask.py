"""08 KV-cache generation, its last task: the attention mask that stops being causal
when a padding mask is passed (declared, in course order, in
smol.grading.checks.generation)."""

import torch

from smol.grading.checks._util import (
    is_tensor,
)
from smol.grading.registry import probe_check


def _reference_mask(attention_mask, T, offset=0):
    Tk = offset + T
    q = torch.arange(offset, Tk)[:, None]
    k = torch.arange(Tk)[None, :]
    mask = (k <= q)[None, None]
    if attention_mask is not None:
        mask = mask & attention_mask.bool()[:, None, None, :] | (k == q)
    return mask


def _mask(out, attention_mask, T, offset=0):
    """Judge side: the student's mask for these arguments, checked and broadcast to
    (B, 1, T, offset + T)."""
    is_tensor(out, "the mask")
    assert out.dtype == torch.bool, (
        f"the mask has dtype {out.dtype}, expected torch.bool"
    )
    B = 1 if attention_mask is None else attention_mask.shape[0]
    try:
        return out.expand(B, 1, T, offset + T)
    except RuntimeError:
        raise AssertionError(
            f"the mask has shape {tuple(out.shape)}, which does not broadcast to "
            f"(B, 1, T, offset + T) = {(B, 1, T, offset + T)}"
        ) from None


# left padding (generation), none, right padding (training batches)
PADDED = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


def _mask_check(name, points, hint, cases, judge):
    """A check of the masks for `cases` ((attention_mask, T, offset) each):
    judge(masks) decides on them, each checked and broadcast by `_mask`."""
    probe_check(
        "attention_mask_bug",
        name,
        points,
        hint,
        inputs=lambda: cases,
        judge=lambda inputs, outs: judge(
            [_mask(out, *case) for case, out in zip(inputs, outs, strict=True)]
        ),
    )(lambda fn, inputs: [fn(*case) for case in inputs])


def _judge_causal(masks):
    for (_, T, offset), got in zip(((None, 5, 0), (None, 3, 4)), masks):
        assert torch.equal(got, _reference_mask(None, T, offset)), (
            f"wrong causal mask for T={T}, offset={offset}"
        )


_mask_check(
    "no padding mask: causal, also with cached tokens before",
    1,
    "query at position offset + i sees keys 0 .. offset + i",
    [(None, 5, 0), (None, 3, 4)],
    _judge_causal,
)


def _judge_padded_hidden(masks):
    (got,), real = masks, PADDED.bool()
    for b in range(len(PADDED)):
        for i in range(6):
            if real[b, i]:
                assert not got[b, 0, i][~real[b]].any(), (
                    f"row {b}: token {i} sees a padded key"
                )


_mask_check(
    "padded keys are hidden from real tokens",
    1,
    "combine with attention_mask.bool()[:, None, None, :] (the keys' axis)",
    [(PADDED, 6, 0)],
    _judge_padded_hidden,
)
SHIFTED = [(PADDED, 6, 0), (PADDED, 2, 4)]


def _judge_real_seen(masks):
    """Real queries see every real key up to themselves; with cached tokens
    (offset > 0) no padded key either (at offset 0 that is the business of "padded
    keys are hidden")."""
    real = PADDED.bool()
    for (_, T, offset), got in zip(SHIFTED, masks):
        for b in range(len(PADDED)):
            for i in range(T):
                q = offset + i
                want = real[b, : q + 1]  # the real keys up to the query
                seen = got[b, 0, i, : q + 1]
                if real[b, q] and not seen[want].all():
                    raise AssertionError(
                        f"row {b}: the token at position {q} does not see every "
                        f"real token up to itself (T={T}, offset={offset})"
                    )
                if offset and real[b, q] and seen[~want].any():
                    raise AssertionError(
                        f"row {b}: the token at position {q} sees the padded key "
                        f"{int((seen & ~want).nonzero()[0])} (T={T}, "
                        f"offset={offset}): query i stands at position offset + i"
                    )


_mask_check(
    "real tokens see every real token up to themselves (left or right padding), and "
    "with cached tokens no padded key",
    1,
    "hide only what is padding or later: causal AND attention_mask, with the query "
    "positions offset + 0 .. offset + T - 1; nothing more, and the diagonal at "
    "k == offset + i (not torch.eye(T, offset + T))",
    SHIFTED,
    _judge_real_seen,
)


def _judge_still_causal(masks):
    for (_, T, offset), got in zip(SHIFTED, masks):
        q = torch.arange(offset, offset + T)[:, None]
        k = torch.arange(offset + T)[None, :]
        assert not got[..., k > q].any(), (
            f"a query sees a later key (T={T}, offset={offset})"
        )


_mask_check(
    "with a padding mask, attention is still causal (no peeking at later tokens)",
    2,
    "AND the padding mask with the causal mask; do not replace one by the other",
    SHIFTED,
    _judge_still_causal,
)


def _judge_sees_itself(masks):
    (got,) = masks
    assert got.any(-1).all(), "some query row masks every key"
    for i in range(6):
        assert got[0, 0, i, i], f"row 0: query {i} does not see itself"


_mask_check(
    "a padding query still sees itself (no all-masked row, no NaN)",
    1,
    "OR the diagonal back in: (k_pos == q_pos); a row of only -inf makes softmax "
    "return NaN",
    [(PADDED, 6, 0)],
    _judge_sees_itself,
)
