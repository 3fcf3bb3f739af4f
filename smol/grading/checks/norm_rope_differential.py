"""01 RMSNorm and 02 RoPE, every task against smol's on generated inputs
(`_differential`): inputs of any rank and odd widths in float32, bfloat16 and
float16, from 1e-4 to beyond float16's squares (x ** 2 of 300 is inf there), eps
from 1e-8 to 0.5 and rows of zeros; weights in another dtype than x; head sizes from
2 to 256, thetas from 2 to 1e6, tables up to 4,096 positions; rope on queries of
odd head counts, one token or many, with tables sliced at an offset or gathered at
each row's own positions, on contiguous and strided x; values, dtypes and gradients
compared."""

import torch

from smol.grading.checks import _differential as diff

NAME = "generated inputs: values and gradients equal smol's"
CASES = 40
HALF = (torch.bfloat16, torch.float16)
DTYPES = (torch.float32, *HALF)


def tol(dtype, scale=1.0):
    """(atol, rtol) for a result rounded once to `dtype`: a step of it either way
    (float32 steps in another order round a value near a midpoint the other way)."""
    if dtype in HALF:
        step = torch.finfo(dtype).eps
        return (step * scale, 2 * step)
    return (1e-5 * scale, 1e-5)


def relative_tol(case: dict, call, reference, share: float) -> dict:
    """The case with tolerances of `share` of the largest value of smol's result and
    of its largest gradient: in bfloat16 a product of sums rounds at every step, and
    a sum that cancels keeps the error of its largest terms."""
    want = diff.run(call, reference(), case)
    top = max(float(o.detach().float().abs().max()) for o in want["out"])
    grads = [g.float().abs().max() for g in want["grads"].values() if g is not None]
    g_top = float(max(grads)) if grads else 0.0
    return case | {"tol": (share * top, share), "gtol": (share * g_top, share)}


def with_weights(module, weights: dict, *args):
    """Probe side: `module(*args)` with its parameters replaced by `weights` (by
    name), so that the gradients reach them; a name the module lacks is an error."""
    names = {n for n, _ in module.named_parameters()}
    missing = sorted(set(weights) - names)
    if missing:
        raise AttributeError(f"the module has no parameter {', '.join(missing)}")
    return torch.func.functional_call(module, weights, args)


def strided(x: torch.Tensor, dims=(1, 2)) -> torch.Tensor:
    """x's values in the memory of a transposed tensor (queries as attention makes
    them: view(B, T, H, D).transpose(1, 2)); x itself stays in the graph."""
    return x.transpose(*dims).contiguous().transpose(*dims)


def _shape(g, widths, ranks=(1, 2, 3, 4, 5)) -> tuple:
    rank = diff.pick(g, ranks)
    lead = torch.randint(1, 4, (rank - 1,), generator=g).tolist()
    return (*lead, diff.pick(g, widths))


def _activations(g, shape, dtype, scale) -> torch.Tensor:
    x = torch.randn(*shape, generator=g) * scale
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    if len(shape) > 1 and torch.rand((), generator=g) < 0.3:
        x.view(-1, shape[-1])[0] = 0.0  # a row of zeros: rsqrt(eps) times 0
    return x.to(dtype)


# --- 01 RMSNorm
def _rms_case(g) -> dict:
    shape = _shape(g, (1, 2, 3, 5, 7, 16, 33))
    scale = diff.pick(g, (1e-4, 1e-2, 1.0, 1e3))
    eps = diff.pick(g, (1e-8, 1e-5, 1e-2, 0.5))
    x = _activations(g, shape, torch.float32, scale)
    return {
        "what": f"x {shape} of scale {scale:g}, eps={eps:g}",
        "args": {"x": x, "eps": eps},
        "grad": ["x"],
        "up": [torch.randn(*shape[:-1], 1, generator=g)],
        "tol": (1e-6 * scale, 1e-5),
        "gtol": (1e-6, 1e-4),
    }


def _call_rms(fn, args):
    return [fn(args["x"], args["eps"])]


def _smol_rms():
    from smol.grading.checks.norm import _rms_reference

    return _rms_reference


def _norm_case(g) -> dict:
    dtype, weight = diff.pick(g, DTYPES), diff.pick(g, DTYPES)
    shape = _shape(g, (1, 2, 3, 7, 16, 33, 64))
    scale = diff.pick(g, (1e-3, 1.0, 30.0, 1e3) + ((3e4,) if dtype in HALF else (1e5,)))
    eps = diff.pick(g, (1e-6, 1e-5, 1e-2, 0.5))
    x = _activations(g, shape, dtype, scale)
    w = (torch.randn(shape[-1], generator=g) * 0.5 + 1).to(weight)
    step = torch.finfo(dtype).eps if dtype in HALF else 1e-5
    # the weight's gradient is a sum over positions rounded once to the weight's dtype:
    # summed in another order, it may land a step of that dtype away
    g_step = max(step, torch.finfo(weight).eps if weight in HALF else 0.0)
    return {
        "what": f"x {shape} {diff.dtype_name(x)} of scale {scale:g}, "
        f"{diff.dtype_name(w)} weight, eps={eps:g}",
        "args": {"x": x, "weight": w, "eps": eps},
        "grad": ["x", "weight"],
        "up": [torch.randn(*shape, generator=g)],
        "tol": (2 * step, 2 * step),
        "gtol": (8 * g_step / max(scale, 1e-3) + 1e-6, 8 * g_step),
        "dtype": True,
    }


def _call_norm(cls, args):
    module = cls(args["x"].shape[-1], args["eps"])
    return [with_weights(module, {"weight": args["weight"]}, args["x"])]


def _smol_norm():
    from smol.norm import RMSNorm

    return RMSNorm


# --- 02 RoPE
def _frequencies_case(g) -> dict:
    head_dim = diff.pick(g, (2, 4, 6, 8, 10, 16, 32, 48, 64, 96, 128, 256))
    theta = diff.pick(g, (2.0, 10.0, 500.0, 1e4, 1e5, 5e5, 1e6))
    what = f"head_dim={head_dim}, theta={theta:g}"
    return diff.exact(what, {"head_dim": head_dim, "theta": theta}, tol=(1e-7, 1e-5))


def _call_frequencies(fn, args):
    return [fn(args["head_dim"], args["theta"])]


def _smol_frequencies():
    from smol.rope import RotaryEmbedding

    return lambda head_dim, theta: RotaryEmbedding(head_dim, theta, 2).inv_freq()


def _tables_case(g) -> dict:
    length = diff.pick(g, (1, 2, 7, 64, 300, 1000, 2048, 4096))
    head_dim = diff.pick(g, (2, 4, 8, 16, 32) + ((64, 128) if length < 1000 else ()))
    theta = diff.pick(g, (10.0, 500.0, 1e4, 1e5, 5e5))
    return {
        "what": f"length={length}, head_dim={head_dim}, theta={theta:g}",
        "args": {"length": length, "head_dim": head_dim, "theta": theta},
        "grad": [],
        "up": [None, None],
        # an angle of position p is float32's p * frequency, to a step of p
        "tol": (1e-5 + 2e-7 * length, 0.0),
        "dtype": True,
    }


def _call_tables(fn, args):
    out = fn(args["length"], args["head_dim"], args["theta"])
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TypeError("rope_tables should return (cos, sin)")
    return list(out)


def _smol_tables():
    from smol.rope import RotaryEmbedding

    def tables(length, head_dim, theta):
        rope = RotaryEmbedding(head_dim, theta, max(length, 2))
        return rope(length, torch.device("cpu"))

    return tables


def _rotate_case(g) -> dict:
    shape = _shape(g, (2, 4, 6, 8, 16, 64), ranks=(1, 2, 3, 4, 5))
    dtype = diff.pick(g, DTYPES)
    layout = (
        diff.pick(g, ("contiguous", "strided")) if len(shape) >= 3 else "contiguous"
    )
    x = torch.randn(*shape, generator=g).to(dtype)
    return {
        "what": f"x {shape} {diff.dtype_name(x)}, {layout}",
        "args": {"x": x, "layout": layout},
        "grad": ["x"],
        "up": [torch.randn(*shape, generator=g)],
        "tol": (0.0, 0.0),  # x's values, moved and negated: exact in any dtype
        "gtol": (0.0, 0.0),
    }


def _call_rotate(fn, args):
    x = args["x"]
    return [fn(strided(x) if args["layout"] == "strided" else x)]


def _smol_rotate():
    from smol.rope import rotate_half

    return rotate_half


def _positions(g, B: int, T: int, kind: str) -> torch.Tensor:
    """(B, T) position ids: each row from its own start, left padding repeating
    position 0, or shuffled (as a packed batch's documents leave them)."""
    starts = torch.randint(0, 100, (B, 1), generator=g)
    if kind == "each row its own start":
        return starts + torch.arange(T)
    if kind == "left-padded rows":
        pad = torch.randint(0, T, (B, 1), generator=g)
        return (torch.arange(T) - pad).clamp(min=0)
    return torch.stack([torch.randperm(T, generator=g) for _ in range(B)]) + starts


TABLES = (
    "sliced at an offset",
    "each row its own start",
    "left-padded rows",
    "shuffled",
)


def _rope_case(g) -> dict:
    B, H = int(torch.randint(1, 4, (), generator=g)), diff.pick(g, (1, 3, 5, 9))
    T, D = diff.pick(g, (1, 1, 2, 5, 17)), diff.pick(g, (2, 4, 6, 8, 16, 64))
    dtype, kind = diff.pick(g, DTYPES), diff.pick(g, TABLES)
    layout = diff.pick(g, ("contiguous", "strided"))
    theta, scale = diff.pick(g, (1e4, 1e5)), diff.pick(g, (1.0, 100.0, 2e4))
    cos, sin = _smol_tables()(128, D, theta)
    if kind == "sliced at an offset":
        start = int(torch.randint(0, 100, (), generator=g))
        cos, sin, where = cos[start : start + T], sin[start : start + T], start
    else:
        pos = _positions(g, B, T, kind)
        cos, sin, where = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1), pos.tolist()
    x = torch.randn(B, H, T, D, generator=g) * scale
    x = (x.clamp(-6e4, 6e4) if dtype == torch.float16 else x).to(dtype)
    return {
        "what": f"x {(B, H, T, D)} {diff.dtype_name(x)} of scale {scale:g}, "
        f"{layout}, theta={theta:g}, tables {kind} {where}",
        "args": {"x": x, "cos": cos, "sin": sin, "layout": layout},
        "grad": ["x"],
        "up": [torch.randn(B, H, T, D, generator=g)],
        "tol": tol(dtype, scale),
        "gtol": tol(dtype, 4.0),
        "dtype": True,
    }


def _call_rope(fn, args):
    x = args["x"]
    x = strided(x) if args["layout"] == "strided" else x
    return [fn(x, args["cos"], args["sin"])]


def _smol_rope():
    from smol.rope import apply_rope

    return apply_rope


for tasks, make, call, reference, hint in (
    (
        ("rms",),
        _rms_case,
        _call_rms,
        _smol_rms,
        "the case named below differs from sqrt(mean(x^2) + eps) over the last "
        "dimension, whatever x's rank (1-D too), in its value or its gradient: eps is "
        "added inside the root, where it decides the result when mean(x^2) is near or "
        "below it (a row of zeros gives sqrt(eps))",
    ),
    (
        ("rmsnorm", "rmsnorm_bug"),
        _norm_case,
        _call_norm,
        _smol_norm,
        "the case named below differs from smol.norm.RMSNorm in a value, the dtype or "
        "the gradient of x or the weight: x.float(), x * rsqrt(mean(x^2) + eps) in "
        "float32, cast back once to x's dtype, then times the weight in the weight's "
        "own dtype (a bfloat16 weight and float32 x give float32); a row of zeros "
        "stays 0",
    ),
    (
        ("rope_frequencies",),
        _frequencies_case,
        _call_frequencies,
        _smol_frequencies,
        "the case named below differs from smol.rope.RotaryEmbedding.inv_freq: "
        "1 / theta ** (arange(0, head_dim, 2) / head_dim) in float32, for every even "
        "head_dim and theta",
    ),
    (
        ("rope_tables",),
        _tables_case,
        _call_tables,
        _smol_tables,
        "the case named below differs from smol.rope.RotaryEmbedding's tables: the "
        "positions in float32 (bfloat16 rounds positions above 256, float16 above "
        "2,048), outer(positions, frequencies), then cat((angles, angles), -1)",
    ),
    (
        ("rotate_half",),
        _rotate_case,
        _call_rotate,
        _smol_rotate,
        "the case named below differs from smol.rope.rotate_half: (x1, x2) -> "
        "(-x2, x1) on the halves of the last dimension only, any rank, bfloat16 and "
        "float16 too, strided x too; the gradient passes through exactly",
    ),
    (
        ("rope", "rope_bug"),
        _rope_case,
        _call_rope,
        _smol_rope,
        "the case named below differs from smol.rope.apply_rope in a value, the dtype "
        "or the gradient of x: x * cos + rotate_half(x) * sin with the tables as "
        "given, broadcast as they come ((T, D), or (B, 1, T, D) with each row's own "
        "positions: no slicing to T, which cuts the batch of gathered tables), in "
        "float32, cast back once to x's dtype",
    ),
):
    diff.register(tasks, NAME, 1, hint, make, call, reference, CASES)
