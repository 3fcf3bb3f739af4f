"""The settings of a training run (TrainConfig), checked when they are made: a bad one
is a one-line ValueError before any work, from the command line and the Python API
alike."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

import torch

from smol.config import PRESETS, SmolConfig
from smol.optim import lr_schedule

POSITIVE_INTS = (
    "steps",
    "batch_size",
    "seq_len",
    "grad_accum",
    "eval_batches",
    "log_every",
    "keep_checkpoints",
)
NON_NEGATIVE_INTS = (
    "warmup_steps",
    "eval_every",
    "sample_every",
    "sample_tokens",
    "ckpt_every",
    "seed",
    "max_tokens",
)
FLAGS = ("compile", "overwrite", "allow_changed_settings", "progress")
# the named tokenizers' sizes: the vocabularies of the presets they were made for
NAMED_TOKENIZERS = {
    "shakespeare": PRESETS["tiny"].vocab_size,
    "smollm2": PRESETS["smollm2-135m"].vocab_size,
}


@dataclass
class TrainConfig:
    """Every setting of a run, checked when made (validate). A resume must keep those
    that decide what is trained; it may change log_every, eval_every, eval_batches,
    sample_*, ckpt_every, keep_checkpoints, out_dir, device, compile and progress
    (smol.resume.MAY_CHANGE); another device or compile gives the same run up to
    floating-point rounding, not bit for bit."""

    preset: str | None = "tiny"  # None: the model is given to the Trainer
    # SmolConfig fields, e.g. {"num_hidden_layers": 2}
    model_overrides: dict = field(default_factory=dict)
    # "shakespeare" (vocab 4096), "smollm2" (49152), or "auto" from the vocab size;
    # with data also "bpe:N" (trained on it) or a tokenizer folder or tokenizer.json
    tokenizer: str = "auto"
    # the training text: "" the bundled plays; a text, JSONL or Parquet file, a folder
    # of them, or "hf:NAME" a Hugging Face dataset, streamed (smol.sources)
    data: str = ""
    data_config: str = ""  # hf:NAME's configuration, e.g. sample-10BT
    data_files: str = ""  # hf:NAME's data_files, e.g. a Parquet file on disk
    max_tokens: int = 0  # tokenize at most this many tokens of data (0: all)
    val_fraction: float = 0.05  # of data's documents, held out for validation
    shards: str = ""  # the token shards' folder; "": OUT_DIR/data
    # start from these weights (their config and tokenizer): "smollm2" (the released
    # model smol finetune starts from), a model folder or a .gguf file
    init: str = ""
    steps: int = 300
    batch_size: int = 16  # sequences per micro-batch per rank
    seq_len: int = 128
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 30
    schedule: str = "cosine"  # or "wsd"
    decay_fraction: float = 0.2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0: no clipping
    eval_every: int = 100  # 0: never (the last step always evaluates when > 0)
    eval_batches: int = 8
    sample_every: int = 0
    sample_prompt: str = "Romeo.\n"
    sample_tokens: int = 48
    log_every: int = 10
    ckpt_every: int = 0  # 0: only at the end
    keep_checkpoints: int = 2
    out_dir: str = "runs/tiny"
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"  # auto, bf16, fp16, fp32
    compile: bool = False
    # True or "latest": the newest intact checkpoint in out_dir; or a path
    resume: bool | str = False
    # start over in an out_dir that holds a run, deleting its checkpoints
    overwrite: bool = False
    # resume with settings that differ from the checkpoint's
    allow_changed_settings: bool = False
    progress: bool = True

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError, one line, for the first setting that cannot work; the
        command line and the Python API both check here, before any work."""
        for check in CHECKS:
            check(self)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based) on the schedule."""
        return lr_schedule(
            step,
            max_lr=self.lr,
            warmup_steps=self.warmup_steps,
            total_steps=self.steps,
            min_lr=self.min_lr,
            kind=self.schedule,
            decay_fraction=self.decay_fraction,
        )

    def with_tokenizer(self, vocab_size: int | None = None) -> TrainConfig:
        """This config with tokenizer "auto" made concrete from the model's vocabulary
        size (by default the preset's): "shakespeare" up to 4096 tokens, else
        "smollm2"."""
        if self.tokenizer != "auto":
            return self
        vocab = self.model_config().vocab_size if vocab_size is None else vocab_size
        small = vocab <= NAMED_TOKENIZERS["shakespeare"]
        tokenizer = "shakespeare" if small else "smollm2"
        return dataclasses.replace(self, tokenizer=tokenizer)

    def model_config(self) -> SmolConfig:
        if self.preset is None:
            raise ValueError("preset is None: give the Trainer its model")
        if self.preset not in PRESETS:
            raise ValueError(
                f"unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}"
            )
        if not isinstance(self.model_overrides, dict):
            raise ValueError(
                "model_overrides must be a dict of SmolConfig fields, got "
                f"{self.model_overrides!r}"
            )
        fields = {f.name for f in dataclasses.fields(SmolConfig)}
        for key in self.model_overrides:
            if key not in fields:
                raise ValueError(
                    f"unknown model setting {key!r} in model_overrides; SmolConfig has "
                    f"{', '.join(sorted(fields))}"
                )
        return SmolConfig.preset(self.preset, **self.model_overrides)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _check_counts(c: TrainConfig) -> None:
    for name in POSITIVE_INTS:
        if not _is_int(value := getattr(c, name)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name in NON_NEGATIVE_INTS:
        if not _is_int(value := getattr(c, name)) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if c.seed >= 2**64:  # torch.manual_seed's limit
        raise ValueError(f"seed must lie in [0, 2**64 - 1], got {c.seed}")
    for name in FLAGS:
        if not isinstance(value := getattr(c, name), bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def _check_schedule(c: TrainConfig) -> None:
    if not (_is_number(c.lr) and c.lr > 0):
        raise ValueError(f"lr must be a positive number, got {c.lr!r}")
    if not (_is_number(c.min_lr) and 0 <= c.min_lr <= c.lr):
        raise ValueError(f"min_lr ({c.min_lr!r}) must lie in [0, lr ({c.lr})]")
    if c.warmup_steps > c.steps:
        raise ValueError(
            f"warmup_steps ({c.warmup_steps}) must lie in [0, steps ({c.steps})]"
        )
    if c.schedule not in ("cosine", "wsd"):
        raise ValueError(f"schedule must be 'cosine' or 'wsd', got {c.schedule!r}")
    if not (_is_number(c.decay_fraction) and 0 <= c.decay_fraction <= 1):
        raise ValueError(f"decay_fraction must lie in [0, 1], got {c.decay_fraction!r}")


def _check_optimizer(c: TrainConfig) -> None:
    for name in ("weight_decay", "grad_clip"):
        if not (_is_number(value := getattr(c, name)) and value >= 0):
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    for name in ("beta1", "beta2"):
        if not (_is_number(value := getattr(c, name)) and 0 <= value < 1):
            raise ValueError(f"{name} must lie in [0, 1), got {value!r}")


def _check_choices(c: TrainConfig) -> None:
    _check_tokenizer(c)
    if c.dtype not in ("auto", "bf16", "fp16", "fp32"):
        raise ValueError(
            f"dtype must be one of auto, bf16, fp16, fp32; got {c.dtype!r}"
        )
    try:
        if c.device != "auto":
            torch.device(c.device)
    except (RuntimeError, TypeError):
        raise ValueError(
            "device must be 'auto' or a torch device such as 'cpu' or 'cuda:0', "
            f"got {c.device!r}"
        ) from None


def _check_tokenizer(c: TrainConfig) -> None:
    """auto, shakespeare, smollm2; with data also bpe:N or a tokenizer's path; with init
    the model's own only."""
    t = c.tokenizer
    if not isinstance(t, str) or not t:
        raise ValueError(f"tokenizer must be a name or a path, got {t!r}")
    if t in ("auto", "shakespeare", "smollm2"):
        if c.init and t == "shakespeare":
            raise ValueError(
                f"init {c.init} comes with its own tokenizer; leave tokenizer out"
            )
        return
    if t.startswith("bpe:"):
        size = t[4:]
        if not (size.isdigit() and 257 <= int(size) <= 1 << 20):
            raise ValueError(
                f"tokenizer {t}: expected bpe:N with N a vocabulary size in "
                "[257, 2**20]"
            )
        if c.init:
            raise ValueError(
                f"init {c.init} comes with its own tokenizer: a new {t} would not "
                "match its embeddings; leave tokenizer out"
            )
        if c.preset in PRESETS and int(size) > c.model_config().vocab_size:
            raise ValueError(
                f"tokenizer {t} has {size} tokens; the {c.preset} model's vocab_size "
                f"is {c.model_config().vocab_size}: give --set vocab_size={size} or "
                "a smaller bpe:N"
            )
    elif not os.path.exists(t):
        raise ValueError(
            "tokenizer must be one of auto, shakespeare, smollm2, bpe:N, or a "
            f"tokenizer folder or tokenizer.json; got {t!r}, which is no such file or "
            "folder"
        )
    if not c.data:
        raise ValueError(f"tokenizer {t} is for data of your own: give data too")


def _check_data(c: TrainConfig) -> None:
    from smol import sources

    for name in ("data", "data_config", "data_files", "shards", "init"):
        if not isinstance(value := getattr(c, name), str):
            raise ValueError(f"{name} must be a str, got {value!r}")
    if c.data:
        sources.check(c.data, c.data_config, c.data_files)
    elif c.data_config or c.data_files or c.shards:
        raise ValueError("data_config, data_files and shards need data")
    if not (_is_number(c.val_fraction) and 0 < c.val_fraction <= 0.5):
        raise ValueError(f"val_fraction must lie in (0, 0.5], got {c.val_fraction!r}")
    if c.init and c.model_overrides:
        raise ValueError(
            f"init {c.init} gives the model's config: model_overrides (--set) cannot "
            "change it"
        )
    if c.init and c.init != "smollm2" and not os.path.exists(c.init):
        raise ValueError(
            f"init must be smollm2, a model folder or a .gguf file; {c.init} is no "
            "such file or folder"
        )


def _check_run_folder(c: TrainConfig) -> None:
    if not isinstance(c.out_dir, (str, os.PathLike)) or not str(c.out_dir):
        raise ValueError(f"out_dir must be a folder's path, got {c.out_dir!r}")
    path_like = isinstance(c.resume, (str, os.PathLike)) and str(c.resume)
    if not (isinstance(c.resume, bool) or path_like):
        raise ValueError(
            "resume must be True, False, 'latest' or a checkpoint's path, "
            f"got {c.resume!r}"
        )
    if c.resume and c.overwrite:
        raise ValueError(
            "resume and overwrite exclude each other: continue the run, or start over"
        )


def _check_model(c: TrainConfig) -> None:
    if not isinstance(c.sample_prompt, str):
        raise ValueError(f"sample_prompt must be a str, got {c.sample_prompt!r}")
    try:  # bytes of the command line that are not UTF-8 come as lone surrogates
        c.sample_prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"sample_prompt is not UTF-8 text: {c.sample_prompt!r}"
        ) from None
    if not c.sample_prompt and c.sample_tokens:
        raise ValueError(
            "sample_prompt is empty: give a text for the samples to continue, or "
            "sample_tokens=0 for none"
        )
    if c.preset is None or c.init:  # the Trainer checks seq_len against its model
        return
    context = c.model_config().max_position_embeddings
    if c.seq_len > context:
        raise ValueError(
            f"seq_len {c.seq_len} is longer than the model's context "
            f"(max_position_embeddings={context})"
        )


# In the order validate reports them: the first failing setting is the one named.
CHECKS = (
    _check_counts,
    _check_schedule,
    _check_optimizer,
    _check_data,
    _check_choices,
    _check_run_folder,
    _check_model,
)
