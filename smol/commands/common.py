"""What every command shares: one UsageError, a parser whose errors are UsageErrors,
and how a command's outcome becomes one line on stderr and an exit status."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable

from smol.interrupt import Terminated  # noqa: F401 - the commands take it from here

EXIT_STATUS = """exit status: 0 done; 2 a usage error, found before any work; 1 a
failure while running; 130 Ctrl-C; 143 SIGTERM. Each error is one line on stderr."""
# Failures while running: the first line of the message on stderr, exit status 1.
FAILURES = (OSError, ValueError, RuntimeError, TypeError)


class UsageError(Exception):
    """A command line that cannot work: exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are UsageErrors (argparse would print its usage
    too, and exit by itself)."""

    def error(self, message):
        raise UsageError(message)


def check_text(text: str | None, what: str) -> None:
    """A UsageError naming `what` where `text`, from the command line, is not UTF-8:
    Python keeps such bytes as lone surrogates, which no tokenizer takes."""
    try:
        (text or "").encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not UTF-8 text: {text!r}") from None


# how every command's --help ends, and keeps its docstring's lines
HELP = dict(epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)


def parser(verb: str, doc: str) -> Parser:
    """The parser of `smol VERB`: its module's docstring, then the exit statuses."""
    return Parser(prog=f"smol {verb}", description=doc, **HELP)


def run(
    prog: str,
    parse: Callable[[], object],
    work: Callable[[object], int | None],
    failures: tuple[type[BaseException], ...] = FAILURES,
) -> int:
    """A command's exit status: `parse()`'s settings go to `work`, whose status it
    is (None: 0); 2 after a UsageError, 1 after one of `failures`, 130 after Ctrl-C
    and 143 after SIGTERM, each with one line on stderr (for an interruption, with
    the notes the work added to it: what it kept or discarded). `--help` gives 0.
    Either way this process leaves its torch.distributed group, if it joined one."""
    try:
        try:
            settings = parse()
        except SystemExit as e:  # --help
            return e.code if isinstance(e.code, int) else 0
        with _signals_raise():
            status = work(settings)
        return 0 if status is None else status
    except UsageError as e:
        return _error(prog, e, 2)
    except Terminated as e:
        print(f"\n{prog}: stopped by SIGTERM{_notes(e)}", file=sys.stderr, flush=True)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt as e:
        print(f"\n{prog}: interrupted{_notes(e)}", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except failures as e:
        return _error(prog, e, 1)
    finally:
        dist = sys.modules.get("torch.distributed")  # imported only where it is used
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _notes(e: BaseException) -> str:
    """What a command added to an interruption (what it kept, what it discarded), as
    the rest of the line that says it stopped."""
    notes = getattr(e, "__notes__", [])
    return "".join(f"; {note}" for note in notes)


def _error(prog: str, e: BaseException, status: int) -> int:
    text = str(e).strip()
    message = text.splitlines()[0] if text else type(e).__name__
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    return status


@contextlib.contextmanager
def _signals_raise():
    """While the block runs, Ctrl-C raises KeyboardInterrupt and SIGTERM Terminated
    (on the main thread only), whatever the process inherited: a command started in
    the background of a script inherits SIGINT ignored, and Python then sets no
    handler of its own, so that Ctrl-C would change nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise Terminated("SIGTERM")

    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
        signal.SIGTERM: signal.signal(signal.SIGTERM, terminated),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():  # None: set outside Python
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
