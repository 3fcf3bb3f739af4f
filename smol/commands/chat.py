"""Answer a message with SmolLM2-135M-Instruct (the bundled GGUF weights by default),
or, without one, hold a conversation on stdin: /reset starts over, /exit leaves.

    smol chat "What is the capital of France?"
    smol chat                 # an interactive conversation: /reset, /exit
"""

from __future__ import annotations

import sys

from smol.commands.common import (
    Parser,
    Terminated,
    UsageError,
    check_text,
    parser,
    run,
)
from smol.commands.generate import (
    TextStream,
    add_model_options,
    add_sampling_options,
    check_options,
    decide,
    load,
    seeded,
    stream_reply,
)


def build_parser() -> Parser:
    """The parser of `smol chat`."""
    p = parser("chat", __doc__)
    p.add_argument(
        "message", nargs="?", help="the user's message (none: an interactive chat)"
    )
    add_sampling_options(p, max_new_tokens=256)
    add_model_options(p)
    p.add_argument(
        "--system", default=None, help="a system prompt (default: the template's own)"
    )
    return p


def _parse(argv):
    args = build_parser().parse_args(argv)
    if args.message is not None and not args.message.strip():
        raise UsageError("the message is empty (leave it out for an interactive chat)")
    if args.system is not None and not args.system.strip():
        raise UsageError(
            "--system is empty: give a system prompt, or leave it out for the "
            "template's own"
        )
    check_text(args.message, "the message")
    check_text(args.system, "--system")
    check_options(args)
    if args.message is None:
        for flag in ("speculative", "compile"):
            if getattr(args, flag):
                raise UsageError(
                    f"--{flag} works for one message, not the interactive chat "
                    "(it keeps a growing cache across turns)"
                )
    return args


def _chat(args) -> None:
    decoding = decide(args)
    model, tokenizer = load(args, decoding)
    if args.message is None:
        return interactive(args, model, tokenizer, decoding)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.message})
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    stream_reply(args, decoding, model, tokenizer, ids, skip_special_tokens=True)


def interactive(args, model, tokenizer, decoding, stdin=None, out=None) -> None:
    """A chat on stdin/stdout: a line is a message; /reset forgets, /exit leaves.
    At a terminal Ctrl-C stops the reply under way and the chat goes on, and Ctrl-C
    at the prompt leaves it (exit status 130, as where stdin is not a terminal: no
    one waits at a prompt there)."""
    from smol.chat import ChatSession

    stdin, out = stdin or sys.stdin, out or sys.stdout
    tty = stdin.isatty()

    def notice(text: str) -> None:
        print(f"[{text}]", file=sys.stderr, flush=True)

    session = ChatSession(model, tokenizer, system=args.system, notice=notice)
    notice("a conversation: type a message; /reset starts over, /exit or Ctrl-D leaves")
    while _chat_turn(args, session, tokenizer, decoding, stdin, out, tty):
        pass


def _chat_turn(args, session, tokenizer, decoding, stdin, out, tty) -> bool:
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
            config=decoding.generation,
            generator=seeded(args, decoding.device),
        )
    except ValueError as e:  # a message longer than the context, say
        print(f"\n[{e}]", file=sys.stderr)
        return True
    except KeyboardInterrupt as e:  # the reply so far ends its line
        out.write("\n")
        out.flush()
        if isinstance(e, Terminated) or not tty:
            raise
        print(
            "[stopped; Ctrl-C at the prompt, /exit or Ctrl-D leaves the chat]",
            file=sys.stderr,
        )
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


def main(argv: list[str] | None = None) -> int:
    return run("smol chat", lambda: _parse(argv), _chat)
