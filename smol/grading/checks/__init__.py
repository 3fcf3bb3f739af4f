"""The checks of every task, one module per exercise notebook (two for a notebook whose
checks outgrow one: the second holds its last tasks); importing registers them, in
course order (the order of `TASKS`)."""

from smol.grading.checks import norm, rope, gqa, swiglu, init  # noqa: F401
from smol.grading.checks import assembled, decoder_layer, bpe, generation  # noqa: F401
from smol.grading.checks import (  # noqa: F401
    norm_rope_differential,
    gqa_swiglu_differential,
    model_differential,
)
from smol.grading.checks import attention_mask, fast, speculative  # noqa: F401
from smol.grading.checks import training, train_step, tiled  # noqa: F401
from smol.grading.checks import lora, finetune, gguf, gguf_differential  # noqa: F401
from smol.grading.checks import evaluation  # noqa: F401
from smol.grading.checks import dpo, dpo_loss, dpo_batch  # noqa: F401
from smol.grading.checks import grpo, grpo_loss, grpo_batch  # noqa: F401
from smol.grading.checks import dpo_differential, grpo_differential  # noqa: F401
from smol.grading.checks import (  # noqa: F401
    bpe_differential,
    generation_differential,
    fast_differential,
    training_differential,
    tiled_differential,
    lora_differential,
    evaluation_differential,
)
