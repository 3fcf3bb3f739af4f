"""The checks of every task, one module per exercise notebook; importing registers
them, in course order (the order of `TASKS`)."""

from smol.grading.checks import norm, rope, gqa, swiglu, init  # noqa: F401
from smol.grading.checks import bpe, generation, training, lora  # noqa: F401
