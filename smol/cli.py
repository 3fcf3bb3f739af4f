"""What `python -m smol` and `python -m smol.eval` share: a usage error, and how a
command's failure becomes one line on stderr and an exit status."""

from __future__ import annotations

import sys
from collections.abc import Callable


class UsageError(Exception):
    """A command line that cannot work: exit status 2."""


# Failures while running: the first line of the message on stderr, exit status 1.
FAILURES = (OSError, ValueError, RuntimeError, TypeError)


def exit_status(prog: str, work: Callable[[], object]) -> int:
    """Run work() and return the exit status: 0; 2 after a UsageError; 130 after
    Ctrl-C; 1 after one of FAILURES. Each error is one line on stderr, after prog."""
    try:
        work()
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except FAILURES as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 1
    return 0
