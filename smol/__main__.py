"""Command line: run the real SmolLM2 (the bundled GGUF weights by default) on CPU or
GPU.

    python -m smol generate "Once upon a time" --max-new-tokens 64
    python -m smol chat "What is the capital of France?"
    python -m smol chat                 # an interactive conversation: /reset, /exit
    python -m smol generate "Once upon a time" --dtype bfloat16  # fast, starts at once

Every error is one line: exit status 2 for a bad command line, 1 for anything else.
Training has its own entry point: python -m smol.train.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import statistics
import sys
import time

import torch

from smol.cli import UsageError, exit_status


class TextStream:
    """Print tokens as they come. Decoding the whole continuation each time and printing
    what is new keeps characters that span several tokens (emoji, accents) intact."""

    def __init__(self, tokenizer, skip_special_tokens: bool, out=None):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.out = out if out is not None else sys.stdout  # looked up when made
        self.ids: list[int] = []
        self.times: list[float] = []  # time.perf_counter() as each token came
        self.printed = 0

    def __call__(self, tokens: torch.Tensor) -> None:
        """tokens (1,): this step's new token."""
        self.times.append(time.perf_counter())
        self.ids.append(int(tokens[0]))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        # an incomplete UTF-8 character: wait for its next bytes
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.printed :])
        self.out.flush()
        self.printed = len(text)


def check_args(args) -> None:
    """Reject what cannot work before anything is loaded (UsageError: exit status 2)."""
    text = getattr(args, "prompt", None) if args.command == "generate" else args.message
    if args.command == "generate" and not text:
        raise UsageError("the prompt is empty: give a text to continue")
    if args.command == "chat" and text is not None and not text.strip():
        raise UsageError("the message is empty (leave it out for an interactive chat)")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise UsageError(
            f"--temperature must be a finite number >= 0, got {args.temperature}"
        )
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must lie in (0, 1], got {args.top_p}")
    if args.speculative < 0:
        raise UsageError(
            f"--speculative must be >= 0 draft tokens, got {args.speculative}"
        )
    if args.speculative and args.temperature != 0:
        raise UsageError("--speculative decodes greedily: leave --temperature at 0")
    if args.speculative and args.compile:
        raise UsageError(
            "--speculative and --compile do not combine (the verifying step "
            "changes length from step to step); choose one"
        )
    if args.draft and not args.speculative:
        raise UsageError("--draft drafts for --speculative K: give both")
    if args.draft and (args.quantize or args.dtype not in (None, "float32")):
        raise UsageError(
            f"--draft {args.draft} drafts for the float32 model, whose tokens it "
            "keeps: leave out --dtype and --quantize"
        )
    if args.draft == "int4":
        if args.source is not None and not str(args.source).endswith(".gguf"):
            raise UsageError(
                "--draft int4 drafts with a GGUF file's own Q4_1 codes: give a .gguf "
                f"--source (or none: the bundled file), got {args.source}"
            )
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if not device.startswith("cpu"):
            raise UsageError(
                "--draft int4 runs on the CPU only (PyTorch's int4 kernel there): "
                "add --device cpu"
            )
    if args.command == "chat" and text is None:
        for flag in ("speculative", "compile"):
            if getattr(args, flag):
                raise UsageError(
                    f"--{flag} works for one message, not the interactive chat "
                    "(it keeps a growing cache across turns)"
                )
    if args.dtype == "float16" and args.quantize:
        raise UsageError("--quantize int8 takes --dtype float32 or bfloat16")
    if args.device is not None:
        try:
            device = torch.device(args.device)
        except RuntimeError:
            raise UsageError(
                f"--device must be cpu, cuda or cuda:N, got {args.device!r}"
            ) from None
        if device.type not in ("cpu", "cuda"):
            raise UsageError(
                f"--device must be cpu, cuda or cuda:N, got {args.device!r}"
            )
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                "--device cuda, but this machine has no CUDA device "
                "(or this PyTorch was built without CUDA): use --device cpu"
            )


def _load(args):
    import smol.pretrained
    from smol.quantize import quantize_int8_

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # int8 weights want bfloat16 activations: PyTorch's int8 kernel is slow in float32
    half = (device.startswith("cuda") or args.quantize) and not args.draft
    default = torch.bfloat16 if half else torch.float32
    dtype = getattr(torch, args.dtype) if args.dtype else default
    start = time.perf_counter()
    model, tokenizer = smol.pretrained.load_pretrained(
        args.source, device=device, dtype=dtype
    )
    if args.quantize == "int8":
        quantize_int8_(model)
    print(
        f"[loaded in {time.perf_counter() - start:.1f} s on {device}, {dtype}"
        f"{', int8 weights' if args.quantize else ''}"
        f"{f', {args.draft} draft' if args.draft else ''}]",
        file=sys.stderr,
    )
    if args.compile:
        print(
            "[--compile: the first token waits while the decoding step compiles, "
            "a minute or more on a CPU]",
            file=sys.stderr,
        )
    return model, tokenizer, device


def _fit(ids: list[int], args, model) -> int:
    """How many tokens may follow the prompt: --max-new-tokens, or fewer where the
    context ends."""
    context = model.config.max_position_embeddings
    if len(ids) >= context:
        raise ValueError(
            f"the prompt has {len(ids)} tokens; the model's context holds {context}"
        )
    if len(ids) + args.max_new_tokens > context:
        print(
            f"[stopping at the context's end: {context - len(ids)} new tokens at most]",
            file=sys.stderr,
        )
    return min(args.max_new_tokens, context - len(ids))


def _sampling(args, device) -> dict:
    generator = (
        torch.Generator(device).manual_seed(args.seed)
        if args.seed is not None
        else None
    )
    return dict(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=generator,
    )


def _generate(args, model, tokenizer, ids, skip_special_tokens):
    """Stream the continuation of ids to stdout -> (the time generation started, the
    stream, which holds the new tokens and when each came)."""
    from smol.generate import generate

    n = _fit(ids, args, model)
    ids = torch.tensor([ids], device=model.model.embed_tokens.weight.device)
    draft = None
    if args.draft == "bfloat16":
        draft = copy.deepcopy(model).to(torch.bfloat16)
    elif args.draft == "int4":  # the GGUF file's own 4-bit codes, unchanged
        from smol.int4 import load_int4

        draft = load_int4(args.source, dtype=torch.bfloat16, fused=True)[0]
    weight = model.model.embed_tokens.weight  # the model's dtype, as KVCache reads it
    float32 = weight.dtype == torch.float32 and not args.quantize
    if args.speculative and float32 and ids.device.type == "cpu":
        from smol import prepack

        if prepack.available():  # checks of a few rows: weights reordered once
            model = prepack.prepack(model)
    stream = TextStream(tokenizer, skip_special_tokens)
    start = time.perf_counter()
    generate(
        model,
        ids,
        n,
        eos_token_id=tokenizer.eos_token_id,
        compile=args.compile,
        speculative=args.speculative,
        draft_model=draft,
        stream=stream,
        **_sampling(args, ids.device),
    )
    print()
    return start, stream


def speed_report(loaded: float, start: float, times: list[float]) -> str:
    """One line on how fast it went: `times` holds time.perf_counter() at each new
    token, `start` when generation began, `loaded` the seconds loading took. The
    median step leaves out the waits of a few steps: the prompt's before the first
    token, and with --compile the compiling during the next ones."""
    n, total = len(times), times[-1] - start
    line = f"[{n} new token{'s' * (n > 1)} in {total:.1f} s: {n / total:.1f} tokens/s"
    if n > 1:
        step = statistics.median(b - a for a, b in itertools.pairwise(times))
        line += f", {1 / step:.1f} at the median step"
    line += f", the first after {times[0] - start:.2f} s"
    threads = torch.get_num_threads()
    return line + f"; loaded in {loaded:.1f} s; {threads} thread{'s' * (threads > 1)}]"


def cmd_generate(args) -> None:
    begin = time.perf_counter()
    model, tokenizer, device = _load(args)
    loaded = time.perf_counter() - begin
    ids = tokenizer.encode(args.prompt)
    print(args.prompt, end="", flush=True)
    start, stream = _generate(args, model, tokenizer, ids, skip_special_tokens=False)
    print(speed_report(loaded, start, stream.times), file=sys.stderr)


def cmd_chat(args) -> None:
    model, tokenizer, device = _load(args)
    if args.message is None:
        return interactive(args, model, tokenizer, device)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.message})
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    _generate(args, model, tokenizer, ids, skip_special_tokens=True)


def interactive(args, model, tokenizer, device, stdin=None, out=None) -> None:
    """A chat on stdin/stdout: a line is a message; /reset forgets, /exit leaves.
    Ctrl-C stops the reply under way (or the line being typed), not the chat."""
    from smol.chat import ChatSession

    stdin, out = stdin or sys.stdin, out or sys.stdout
    tty = stdin.isatty()

    def notice(text: str) -> None:
        print(f"[{text}]", file=sys.stderr, flush=True)

    session = ChatSession(model, tokenizer, system=args.system, notice=notice)
    notice("a conversation: type a message; /reset starts over, /exit or Ctrl-D leaves")
    while True:
        try:
            if not _chat_turn(args, session, tokenizer, device, stdin, out, tty):
                break
        except KeyboardInterrupt:  # the reply (or line) so far ends its line
            out.write("\n")
            out.flush()
            print("[stopped; /exit or Ctrl-D leaves the chat]", file=sys.stderr)


def _chat_turn(args, session, tokenizer, device, stdin, out, tty) -> bool:
    """Read a line and answer it; False at the end of the input or on /exit."""
    if tty:
        out.write("> ")
        out.flush()
    try:
        line = _read_line(stdin)
    except UnicodeError as e:
        print(f"[that line is not UTF-8 text ({e.reason}): left out]", file=sys.stderr)
        return True
    if line is None or line == "/exit":
        return False
    if not line:
        return True
    if line == "/reset":
        session.reset()
        print("[the conversation starts over]", file=sys.stderr)
        return True
    if line.startswith("/"):
        print(f"[unknown command {line}: /reset or /exit]", file=sys.stderr)
        return True
    try:
        session.send(
            line,
            args.max_new_tokens,
            stream=TextStream(tokenizer, True, out),
            **_sampling(args, device),
        )
    except ValueError as e:  # a message longer than the context, say
        print(f"\n[{e}]", file=sys.stderr)
        return True
    out.write("\n")
    out.flush()
    return True


def _read_line(stdin) -> str | None:
    """The next line of stdin, stripped; None at its end. Bytes that are not UTF-8
    (or, from a text stream, characters that cannot be encoded) raise a UnicodeError,
    and the line is consumed."""
    buffer = getattr(stdin, "buffer", None)  # read bytes where there are any
    raw = buffer.readline() if buffer is not None else stdin.readline()
    if not raw:
        return None
    line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    line.encode("utf-8")  # a lone surrogate cannot be
    return line.strip()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse would print the usage as
    well), with exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_sampling_options(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    """How many tokens follow, and how each is chosen."""
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0 (the default) is greedy"
    )
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None, help="in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Which weights, where and in what precision they run, and how to decode fast."""
    p.add_argument(
        "--source",
        default=None,
        help="a .gguf file, a Hugging Face folder or hub id (default: the "
        "bundled GGUF)",
    )
    p.add_argument(
        "--device", default=None, help="default: cuda when available, else cpu"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for PyTorch (torch.set_num_threads; default: PyTorch's, "
        "usually one per core)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="default: float32 on CPU, bfloat16 on GPU or with --quantize int8",
    )
    p.add_argument(
        "--quantize",
        choices=["int8"],
        default=None,
        help="weight-only int8 (per output channel) for every Linear",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile the decode step (torch.compile, a static KV cache)",
    )
    p.add_argument(
        "--speculative",
        type=int,
        default=0,
        metavar="K",
        help="greedy prompt-lookup speculative decoding with up to K draft tokens",
    )
    p.add_argument(
        "--draft",
        choices=["bfloat16", "int4"],
        default=None,
        help="with --speculative K: draft with a bfloat16 copy of the model, or (CPU) "
        "with the GGUF file's own int4 codes, instead of prompt lookup (float32's "
        "tokens, checked in float32)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m smol",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    about = "continue a text"
    generate = commands.add_parser("generate", help=about, description=about)
    generate.add_argument("prompt", help="the text to continue")
    add_sampling_options(generate, max_new_tokens=64)
    add_model_options(generate)
    generate.set_defaults(fn=cmd_generate)

    about = "answer a message, or chat interactively without one"
    chat = commands.add_parser("chat", help=about, description=about)
    chat.add_argument(
        "message", nargs="?", help="the user's message (none: an interactive chat)"
    )
    add_sampling_options(chat, max_new_tokens=256)
    add_model_options(chat)
    chat.add_argument(
        "--system", default=None, help="a system prompt (default: the template's own)"
    )
    chat.set_defaults(fn=cmd_chat)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    def work():
        check_args(args)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        args.fn(args)

    return exit_status(f"{parser.prog} {args.command}", work)


if __name__ == "__main__":
    sys.exit(main())
