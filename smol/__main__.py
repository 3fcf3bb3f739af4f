"""`python -m smol VERB ...`: the `smol` command (smol.commands)."""

import sys

from smol.commands import main

if __name__ == "__main__":
    sys.exit(main())
