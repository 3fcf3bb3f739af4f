"""Command line: run the real SmolLM2 (the bundled GGUF weights by default) on CPU or
GPU.

    python -m smol generate "Once upon a time" --max-new-tokens 64
    python -m smol chat "What is the capital of France?"

Training has its own entry point: python -m smol.train.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


class TextStream:
    """Print tokens as they come. Decoding the whole continuation each time and printing
    what is
    new keeps characters that span several tokens (emoji, accents) intact."""

    def __init__(self, tokenizer, skip_special_tokens: bool, out=sys.stdout):
        self.tokenizer, self.skip, self.out = tokenizer, skip_special_tokens, out
        self.ids: list[int] = []
        self.printed = 0

    # tokens (1,): this step's new token
    def __call__(self, tokens: torch.Tensor) -> None:
        self.ids.append(int(tokens[0]))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        # an incomplete UTF-8 character: wait for its next bytes
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.printed :])
        self.out.flush()
        self.printed = len(text)


def _load(args):
    from smol.pretrained import load_pretrained

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype
        else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    )
    start = time.perf_counter()
    model, tokenizer = load_pretrained(args.source, device=device, dtype=dtype)
    print(
        f"[loaded in {time.perf_counter() - start:.1f} s on {device}, {dtype}]",
        file=sys.stderr,
    )
    return model, tokenizer, device


def _generate(args, model, tokenizer, ids, skip_special_tokens):
    from smol.generate import generate

    generator = (
        torch.Generator(ids.device).manual_seed(args.seed)
        if args.seed is not None
        else None
    )
    generate(
        model,
        ids,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        eos_token_id=tokenizer.eos_token_id,
        generator=generator,
        stream=TextStream(tokenizer, skip_special_tokens),
    )
    print()


def cmd_generate(args) -> None:
    model, tokenizer, device = _load(args)
    ids = torch.tensor([tokenizer.encode(args.prompt)], device=device)
    print(args.prompt, end="", flush=True)
    _generate(args, model, tokenizer, ids, skip_special_tokens=False)


def cmd_chat(args) -> None:
    model, tokenizer, device = _load(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.message})
    ids = torch.tensor(
        [tokenizer.apply_chat_template(messages, tokenize=True)], device=device
    )
    _generate(args, model, tokenizer, ids, skip_special_tokens=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m smol",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def add_command(name, fn, help, text_arg, text_help, max_new_tokens):
        p = commands.add_parser(name, help=help, description=help)
        p.add_argument(text_arg, help=text_help)
        p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
        p.add_argument(
            "--temperature", type=float, default=0.0, help="0 (the default) is greedy"
        )
        p.add_argument("--top-k", type=int, default=None)
        p.add_argument("--top-p", type=float, default=None)
        p.add_argument("--seed", type=int, default=None, help="seed for sampling")
        p.add_argument(
            "--source",
            default=None,
            help="a .gguf file, a Hugging Face folder or hub id (default: the bundled GGUF)",
        )
        p.add_argument(
            "--device", default=None, help="default: cuda when available, else cpu"
        )
        p.add_argument(
            "--dtype",
            choices=["float32", "bfloat16", "float16"],
            default=None,
            help="default: float32 on CPU, bfloat16 on GPU",
        )
        p.set_defaults(fn=fn)
        return p

    add_command(
        "generate",
        cmd_generate,
        "continue a text",
        "prompt",
        "the text to continue",
        64,
    )
    chat = add_command(
        "chat",
        cmd_chat,
        "answer one message with the chat template",
        "message",
        "the user's message",
        256,
    )
    chat.add_argument(
        "--system", default=None, help="a system prompt (default: the template's own)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
