"""Argument lists of `python -m smol.train` for the tests: the tiny preset on CPU,
without a progress bar."""

# A one-layer model of the tiny preset, small enough for a test on a CPU.
ONE_LAYER = {
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def cli_args(model: dict, options: str, *more: str) -> list[str]:
    """`--set FIELD=VALUE` for each field of `model`, then `options` as typed on a
    command line, then `more` as they are (paths, say), --no-progress and --device
    cpu."""
    args = ["--preset", "tiny"]
    for name, value in model.items():
        args += ["--set", f"{name}={value}"]
    return args + options.split() + [*more, "--no-progress", "--device", "cpu"]
