"""13 GGUF, permute_qk against smol's on generated inputs (`_differential`): q/k
weights in float32, bfloat16, float16 and uint8 (a model's own weights, Q4_1
codes), from one to nine heads of 2 to 16 rows; every value, and the dtype,
compared. (Q8_0's checks already compare every byte with smol's on float32 rows,
what smol's exporter hands it.)"""

import torch

from smol.grading.checks import _differential as diff

NAME = "generated inputs: values and dtypes equal smol's"
CASES = 40
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.uint8)


def _perm_case(g) -> dict:
    heads, half = diff.pick(g, (1, 2, 3, 4, 9)), diff.pick(g, (1, 2, 4, 8))
    fan_in, dtype = int(torch.randint(1, 10, (), generator=g)), diff.pick(g, DTYPES)
    w = torch.randn(heads * 2 * half, fan_in, generator=g) * 50
    w = (w.abs() if dtype == torch.uint8 else w).to(dtype)
    what = f"w {tuple(w.shape)} {diff.dtype_name(w)}, n_heads={heads}"
    return diff.exact(what, {"w": w, "n_heads": heads})


def _smol_perm():
    from smol.gguf import permute_qk

    return permute_qk


def _call(fn, args):
    return [fn(args["w"], args["n_heads"])]


diff.register(
    "permute_qk",
    NAME,
    1,
    "the case named below differs from smol.gguf.permute_qk: a permutation moves "
    "rows and keeps the weight's dtype (no .float(): smol's exporter hands it a "
    "model's own bfloat16 weights, and smol.int4 its inverse uint8 codes)",
    _perm_case,
    _call,
    _smol_perm,
    CASES,
)
