"""`python -m smol.grade` is `smol grade` (smol.commands.grade), kept for the process
that smol.grading.gradebook starts for each submission."""

import sys

from smol.commands.grade import main

if __name__ == "__main__":
    sys.exit(main())
