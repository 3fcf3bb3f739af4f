"""The command line: `smol VERB ...`, the same as `python -m smol VERB ...`. Each verb
is a module of this folder with a `main(argv) -> exit status`; smol.commands.common
holds what they share (UsageError, the parser, the exit statuses)."""

from __future__ import annotations

import importlib
import sys

VERBS = {
    "generate": "continue a text with the real SmolLM2",
    "chat": "answer a message, or hold a conversation",
    "train": "train a SmolLM from scratch (torchrun -m smol train for DDP)",
    "finetune": "fine-tune on conversations, fully or with LoRA",
    "dpo": "tune a model to prefer the chosen reply of each pair (DPO)",
    "grpo": "tune a model on a task's questions by rewarding right answers (GRPO)",
    "eval": "measure a model on MMLU and the card's benchmarks, or compare two runs",
    "export": "write a model as a GGUF file",
    "grade": "grade exercise notebooks, or a class's submissions",
}


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [f"  {verb:<{width}}  {about}" for verb, about in VERBS.items()]
    return "\n".join(
        ["usage: smol VERB [options]   (smol VERB --help for a verb's)", "", "verbs:"]
        + lines
    )


def main(argv: list[str] | None = None) -> int:
    """Run `smol VERB ...` -> its exit status (2, with one line, for a bad verb)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if not argv or argv[0] not in VERBS:
        problem = f"unknown verb {argv[0]!r}" if argv else "name a verb"
        print(
            f"smol: error: {problem} (one of {', '.join(VERBS)}; see smol --help)",
            file=sys.stderr,
        )
        return 2
    return importlib.import_module(f"smol.commands.{argv[0]}").main(argv[1:])
