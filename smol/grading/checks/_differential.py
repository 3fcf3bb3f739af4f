"""Differential checks: the student's function and smol's on many generated inputs,
values and gradients compared, the first case that differs described.

A targeted check tries one feature at one point; a differential check tries them
together, at their edges: shapes, dtypes, value ranges up to overflow, every option
and their combinations. An exercise gives a table of generators, each `make(g) ->
case` drawing from the torch.Generator g (seeded: a grade is reproducible), and
`call(fn, args) -> [tensors]`, its function's outputs in a fixed order. A case is
plain data:

    {"what": "B=2, T=5, bfloat16, ...",  # how the hint names it
     "args": {...},           # fn's arguments, by name (call passes them)
     "grad": ["logits"],      # the arguments whose gradient is compared
     "up": [tensor | None],   # an upstream gradient per output (None, []: untrained)
     "tol": (atol, rtol),     # for the values
     "gtol": (atol, rtol),    # for the gradients
     "regions": {"padding": (B, T) bool},  # optional: names a differing position
     "dtype": True}           # optional: each result in the dtype of smol's

The probe gives each argument in "grad" as a model's output (a clone of a leaf), runs
call, backpropagates sum(out * up) and hands back the outputs and the leaves'
gradients; the judge does the same with smol's function and compares. Where smol's
raises (a refused input), the student's must raise the same type of error.
"""

from __future__ import annotations

import zlib
from typing import Callable

import torch

from smol.grading.isolation import CheckTimeout, ExitRefused
from smol.grading.registry import probe_check

Table = list[Callable[[torch.Generator], dict]]


def register(
    tasks: str | tuple[str, ...],
    name: str,
    points: int,
    hint: str,
    make: Callable,
    call: Callable,
    reference: Callable,
    n: int,
) -> None:
    """The differential check of each task in `tasks` (one name or several): n cases
    of `make`, seeded by the task's name, the student's function run by `call` in its
    own process, judged against smol's (`reference()` gives it)."""
    for task in (tasks,) if isinstance(tasks, str) else tasks:
        probe_check(
            task,
            name,
            points,
            hint,
            inputs=lambda task=task: cases([make], n, task),
            judge=judge(call, reference),
        )(probe(call))


def cases(table: Table, n: int, name: str) -> list[dict]:
    """n cases, the table's generators in turn, from a generator seeded by `name`."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return [table[i % len(table)](g) for i in range(n)]


def exact(what: str, args: dict, tol=(0.0, 0.0)) -> dict:
    """A case whose results are compared without gradients: their values (equal, or
    within `tol`) and dtypes."""
    return {"what": what, "args": args, "grad": [], "up": [], "tol": tol, "dtype": True}


def run(call: Callable, fn, case: dict) -> dict:
    """fn on the case: {"out": [tensors], "grads": {name: tensor | None}}, or
    {"raised": type, "message": text} when it raised."""
    leaves = {
        k: case["args"][k].detach().clone().requires_grad_(True) for k in case["grad"]
    }
    args = case["args"] | {k: v.clone() for k, v in leaves.items()}
    try:
        outs = list(call(fn, args))
        total = 0.0
        for out, up in zip(outs, case["up"]):
            if up is not None and isinstance(out, torch.Tensor) and out.requires_grad:
                total = total + (out.float() * up).sum()
        if isinstance(total, torch.Tensor):
            total.backward()
    except (NotImplementedError, CheckTimeout, ExitRefused):
        raise  # a stub ("not written yet"), the time limit, os._exit: the grader's
    except Exception as e:  # noqa: BLE001 -- what it raised is judged
        return {"raised": type(e).__name__, "message": str(e)[:200]}
    return {"out": outs, "grads": {k: v.grad for k, v in leaves.items()}}


def probe(call: Callable):
    """The probe of a differential check: `call` on each case."""

    def probe(fn, inputs):
        return [run(call, fn, case) for case in inputs]

    return probe


def judge(call: Callable, reference: Callable[[], Callable]):
    """The judge of a differential check: smol's function (reference()) through
    `call` on each case, compared with what the probe handed back."""

    def judge(inputs, outputs) -> None:
        assert isinstance(outputs, list) and len(outputs) == len(inputs), (
            "one result a case"
        )
        fn, threads = reference(), torch.get_num_threads()
        torch.set_num_threads(1)  # small tensors: threads only wait on each other
        try:
            for i, (case, got) in enumerate(zip(inputs, outputs)):
                try:
                    _compare(got, run(call, fn, case), case)
                except AssertionError as e:
                    raise AssertionError(
                        f"case {i + 1} of {len(inputs)} ({case['what']}): {e}"
                    ) from None
        finally:
            torch.set_num_threads(threads)

    return judge


def _compare(got, want: dict, case: dict) -> None:
    assert isinstance(got, dict), "the probe handed back something else"
    if "raised" in want:
        assert got.get("raised") == want["raised"], (
            f"smol's raises {want['raised']} ({want['message']}); yours "
            + (f"raised {got['raised']}" if "raised" in got else "returned")
        )
        return
    assert "raised" not in got, f"raised {got['raised']}: {got['message']}"
    outs, wants = got["out"], want["out"]
    assert isinstance(outs, list) and len(outs) == len(wants), (
        f"{len(wants)} results expected"
    )
    for k, (out, w) in enumerate(zip(outs, wants)):
        what = f"result {k + 1}" if len(wants) > 1 else "the result"
        assert isinstance(out, torch.Tensor), f"{what} is not a tensor"
        assert not case.get("dtype") or out.dtype == w.dtype, (
            f"{what} is {out.dtype}, smol's {w.dtype}"
        )
        if w.numel() == 1 and out.numel() == 1:
            out, w = out.reshape(()), w.reshape(())
        _close(out, w, what, case["tol"], case.get("regions", {}))
    for name in case["grad"]:
        g, w = got["grads"].get(name), want["grads"][name]
        if w is None or not w.any():
            assert g is None or not g.any(), (
                f"a gradient reaches {name}, where smol's sends none"
            )
            continue
        assert g is not None, f"no gradient reached {name}"
        _close(g, w, f"the gradient of {name}", case["gtol"], case.get("regions", {}))


def _close(out, want, what: str, tol, regions: dict) -> None:
    """out close to want where want is finite (finite there too), else equal."""
    assert tuple(out.shape) == tuple(want.shape), (
        f"{what} has shape {tuple(out.shape)}, expected {tuple(want.shape)}"
    )
    a, e = out.detach().float(), want.detach().float()
    atol, rtol = tol
    ok = torch.isclose(a, e, atol=atol, rtol=rtol) | (a == e)
    ok &= torch.isfinite(a) | ~torch.isfinite(e)
    if ok.all():
        return
    where = tuple(int(i) for i in (~ok).nonzero()[0])
    place = f" at {list(where)}" if where else ""
    for region, mask in regions.items():
        if mask.dim() <= len(where) and mask[where[: mask.dim()]]:
            place += f" ({region})"
    raise AssertionError(
        f"{what} differs from smol's in {int((~ok).sum())} of {ok.numel()} "
        f"values; first{place}: {a[where].item():.6g}, expected {e[where].item():.6g}"
    )


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def pick(g: torch.Generator, options):
    """One of `options`, drawn from g."""
    return options[int(torch.randint(len(options), (), generator=g))]
