"""The checks of every task, one module per exercise notebook; importing registers
them, in course order (the order of `TASKS`)."""

from smol.grading.checks import norm, rope, gqa, swiglu, init  # noqa: F401
from smol.grading.checks import assembled, bpe, generation, fast  # noqa: F401
from smol.grading.checks import training, tiled, lora  # noqa: F401
from smol.grading.checks import gguf  # noqa: F401
from smol.grading.checks import evaluation  # noqa: F401
