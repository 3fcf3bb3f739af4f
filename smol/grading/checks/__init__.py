"""The checks of every task, one module per exercise notebook; importing registers them."""

from smol.grading.checks import norm, rope, gqa, swiglu, init, training, generation  # noqa: F401  (course order)
from smol.grading.checks import bpe  # noqa: F401
from smol.grading.checks import lora  # noqa: F401
