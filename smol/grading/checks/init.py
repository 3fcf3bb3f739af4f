"""05 Tying and init: tie_weights, init_weights, and an init that initialises the tied
matrix twice."""

import math
from collections import Counter

import torch

from smol import SmolLM
from smol.grading.checks._util import close, same_std, small_config
from smol.grading.registry import probe_check, task
from smol.norm import RMSNorm

task(
    "tie_weights",
    "tying_and_init",
    "tie_weights(model): one matrix for the embedding and the head",
)
task(
    "init_weights",
    "tying_and_init",
    "init_weights(model): GPT-2 style init with scaled residual projections",
)
task(
    "init_bug",
    "tying_and_init",
    "Find the bug: an init that initialises the tied matrix twice",
)

CONFIG = small_config(  # 5 layers: sqrt(2 * 5) is neither 5 / 2 nor sqrt(5)
    512,
    hidden_size=96,
    intermediate_size=256,
    num_hidden_layers=5,
    max_position_embeddings=32,
    initializer_range=0.05,
)


def _untied_model(config=CONFIG):
    model = SmolLM(config.replace(tie_word_embeddings=False))
    model.config = config  # the student's tie_weights reads the tied config
    return model


def _tied_by(fn):
    """An untied model after the student's tie_weights ran on it."""
    model = _untied_model()
    fn(model)
    return model


def _tied(model) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


def _judge_one_tensor(inputs, out):
    assert out["tied"], "lm_head.weight and embed_tokens.weight are different tensors"
    assert out["count"] == SmolLM(CONFIG).count_params(), (
        "the tied model still counts two matrices"
    )


@probe_check(
    "tie_weights",
    "the head's weight is the embedding's Parameter (one tensor, not a copy)",
    2,
    "model.lm_head.weight = model.model.embed_tokens.weight (assign the Parameter "
    "itself)",
    judge=_judge_one_tensor,
)
def _(fn, _):
    model = _tied_by(fn)
    return {"tied": _tied(model), "count": model.count_params()}


def _judge_embedding_kept(embedding, out):
    assert isinstance(out, torch.Tensor) and torch.equal(out, embedding), (
        "the embedding's values changed"
    )


@probe_check(
    "tie_weights",
    "the head takes the embedding's values, not the other way round",
    1,
    "assign the embedding to the head, not the head to the embedding",
    inputs=lambda: torch.randn(CONFIG.vocab_size, CONFIG.hidden_size) * 0.02,
    judge=_judge_embedding_kept,
)
def _(fn, embedding):
    model = _untied_model()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embedding)
    fn(model)
    return model.model.embed_tokens.weight


def _smol(state):
    """Judge side: smol's model of CONFIG, holding `state`."""
    model = SmolLM(CONFIG)
    model.load_state_dict(state)
    return model


def _ids():
    """Token ids (2, 9): 8 positions to predict the next token of."""
    return torch.randint(0, CONFIG.vocab_size, (2, 9))


def _finite_grad(grad, what: str) -> None:
    """Judge side: a gradient reached `what`, and it is finite."""
    assert grad is not None and torch.isfinite(grad).all(), (
        f"no finite gradient reached {what}"
    )


def _learned(model, ids) -> dict:
    """Probe side: the model's state, then its next-token logits on `ids`, their loss
    sent backward (the gradients stay on the model's parameters)."""
    state = model.state_dict()
    logits, loss = model(ids[:, :-1], targets=ids[:, 1:])
    loss.backward()
    return {"state": state, "logits": logits}


def _judge_tied_runs(ids, out):
    logits = _smol(out["state"])(ids[:, :-1])[0]
    close(out["logits"], logits, "the tied model's logits")
    _finite_grad(out["grad"], "the shared matrix")


@probe_check(
    "tie_weights",
    "the tied model runs and learns: smol's logits, a gradient for the shared matrix",
    1,
    "tie the Parameter (lm_head.weight = embed_tokens.weight); replacing lm_head by "
    "the embedding module gives the same weight, and a head that cannot project hidden "
    "states",
    inputs=_ids,
    judge=_judge_tied_runs,
)
def _(fn, ids):
    model = _tied_by(fn)
    return {**_learned(model, ids), "grad": model.model.embed_tokens.weight.grad}


def _judge_untied(inputs, tied):
    assert tied is False, "an untied config was tied"


@probe_check(
    "tie_weights",
    "an untied config (tie_word_embeddings=False) keeps two matrices",
    1,
    "tie only when model.config.tie_word_embeddings is true",
    judge=_judge_untied,
)
def _(fn, _):
    model = SmolLM(CONFIG.replace(tie_word_embeddings=False))
    fn(model)
    return _tied(model)


def _scrambled(config=CONFIG):
    """A model whose parameters all hold 3.0, so only the student's init can make them
    right."""
    model = SmolLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(3.0)
    return model


def _initialised_by(fn, config=CONFIG):
    """A scrambled model after the student's init_weights ran on it."""
    model = _scrambled(config)
    fn(model)
    return model


class _CountWrites:
    """Count in-place random fills (normal_, uniform_ as trunc_normal_ uses) per tensor
    storage."""

    METHODS = ("normal_", "uniform_")

    def __enter__(self):
        self.counts, self.saved = Counter(), {}
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            self.saved[name] = original

            def spy(tensor, *args, _original=original, **kwargs):
                self.counts[tensor.data_ptr()] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, spy)
        return self

    def __exit__(self, *exc):
        for name, original in self.saved.items():
            setattr(torch.Tensor, name, original)


def _std_ok(name, p, expected, tol=0.1):
    same_std(p, expected, name, tol)
    mean = p.detach().float().mean().item()
    assert abs(mean) < 4 * expected / math.sqrt(p.numel()) + 1e-6, (
        f"{name} has mean {mean:.4f}, expected 0"
    )


def _parameters(fn, _=None):
    """Probe side: the parameters of a scrambled model after the student's
    init_weights, by name (a tied head once, as the embedding)."""
    return dict(_initialised_by(fn).named_parameters())


BOTH = ("init_weights", "init_bug")


def _judge_norms(inputs, params):
    for name, module in SmolLM(CONFIG).named_modules():
        if isinstance(module, RMSNorm):
            weight = params[f"{name}.weight"]
            assert torch.equal(weight, torch.ones_like(weight)), (
                f"{name}.weight is not all ones"
            )


probe_check(
    BOTH,
    "norm weights start at one",
    1,
    "nn.init.ones_ on every RMSNorm's weight",
    judge=_judge_norms,
)(_parameters)


def _judge_projections(inputs, params):
    std = CONFIG.initializer_range
    for name, p in params.items():
        if name.endswith(
            (
                "embed_tokens.weight",
                "q_proj.weight",
                "k_proj.weight",
                "v_proj.weight",
                "gate_proj.weight",
                "up_proj.weight",
            )
        ):
            _std_ok(name, p, std)


probe_check(
    BOTH,
    "embedding and projections: N(0, initializer_range)",
    1,
    "nn.init.normal_(weight, mean=0.0, std=config.initializer_range)",
    judge=_judge_projections,
)(_parameters)


def _judge_scaled(inputs, params):
    want = CONFIG.initializer_range / math.sqrt(2 * CONFIG.num_hidden_layers)
    for name, p in params.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            _std_ok(name, p, want)


probe_check(
    BOTH,
    "o_proj and down_proj: std / sqrt(2 * n_layers)",
    1,
    "modules flagged scaled_init write into the residual stream; divide their std by "
    "sqrt(2 * n_layers)",
    judge=_judge_scaled,
)(_parameters)


def _judge_no_copies(inputs, params):
    named = [(n, p) for n, p in params.items() if p.dim() >= 2]
    firsts = []  # the first 256 values of each matrix, standardised
    for name, p in named:
        v = p.detach().flatten()[:256].double()
        firsts.append((name, (v - v.mean()) / v.std().clamp(min=1e-12)))
    for i, (a, va) in enumerate(firsts):
        for b, vb in firsts[i + 1 :]:
            corr = (va * vb).mean().item()
            assert abs(corr) < 0.5, (
                f"{a} and {b} hold the same random numbers (correlation {corr:.2f})"
            )


probe_check(
    BOTH,
    "every matrix draws its own random values (no two are copies of each other)",
    1,
    "seed once, outside the loop (or not at all): torch.manual_seed inside the loop "
    "restarts the generator, and every layer gets the same numbers",
    judge=_judge_no_copies,
)(_parameters)


def _judge_once(inputs, out):
    n = out["writes"]
    assert n <= 1, f"the shared embedding/head matrix was initialised {n} times"
    _std_ok("the shared embedding/head matrix", out["shared"], CONFIG.initializer_range)


@probe_check(
    BOTH,
    "the tied matrix is initialised once, as the embedding",
    2,
    "lm_head.weight IS embed_tokens.weight: skip the head when it is tied (if "
    "module.weight is model.model.embed_tokens.weight: continue)",
    judge=_judge_once,
)
def _(fn, _):
    model = _scrambled()
    shared = model.model.embed_tokens.weight
    with _CountWrites() as spy:
        fn(model)
    return {"writes": spy.counts[shared.data_ptr()], "shared": shared}


def _judge_still_tied(inputs, out):
    assert out["tied"], "init untied the head"
    _std_ok("lm_head.weight", out["head"], CONFIG.initializer_range)


@probe_check(
    BOTH,
    "the head is still tied after init",
    1,
    "initialise in place (nn.init.normal_); assigning new Parameters breaks the tie",
    judge=_judge_still_tied,
)
def _(fn, _):
    model = _initialised_by(fn)
    return {"tied": _tied(model), "head": model.lm_head.weight}


@probe_check(
    BOTH,
    "an untied head gets its own N(0, initializer_range) init",
    1,
    "the skip applies to the tied head only: an untied lm_head is an ordinary "
    "nn.Linear",
    judge=lambda inputs, head: _std_ok(
        "lm_head.weight", head, CONFIG.initializer_range
    ),
)
def _(fn, _):
    model = _initialised_by(fn, CONFIG.replace(tie_word_embeddings=False))
    return model.lm_head.weight


def _judge_learns(ids, out):
    for names, why in (
        (out["replaced"], "is a new Parameter: an optimizer trains the old one"),
        (out["frozen"], "no longer requires a gradient: training could not change it"),
    ):
        assert not names, f"{names[0]} {why}"
    model = _smol(out["state"])
    _, loss = model(ids[:, :-1], targets=ids[:, 1:])
    want = math.log(CONFIG.vocab_size)
    assert torch.isfinite(loss) and abs(loss.item() - want) < 0.5, (
        f"the loss of the freshly initialised model is {loss.item():.3f}, expected "
        f"about {want:.3f}"
    )
    for name, _ in model.named_parameters():
        _finite_grad(out["grads"].get(name), name)


@probe_check(
    BOTH,
    "the model still runs and learns after init: a loss near log(vocab), "
    "every gradient",
    1,
    "initialise values in place and leave the rest alone (the Parameters themselves, "
    "requires_grad, dtypes, modules): a fresh model predicts about uniformly, so its "
    "loss is close to log(vocab_size)",
    inputs=_ids,
    judge=_judge_learns,
)
def _(fn, ids):
    model = _scrambled()
    before = dict(model.named_parameters())
    fn(model)
    named = dict(model.named_parameters())
    out = {"replaced": [n for n, p in named.items() if p is not before.get(n)]}
    out["frozen"] = [n for n, p in named.items() if not p.requires_grad]
    if out["replaced"] or out["frozen"]:  # the judge stops there
        return out
    state = _learned(model, ids)["state"]  # the gradients now on the parameters
    return out | {"state": state, "grads": {n: p.grad for n, p in named.items()}}
