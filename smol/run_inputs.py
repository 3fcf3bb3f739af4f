"""What a run on your own text starts from: its tokenizer (a named one, a tokenizer
folder or file, or bpe:N learnt from the text; its identity is the sha256 of its whole
definition), and for continued pretraining (init) released or fine-tuned weights with
their own tokenizer."""

from __future__ import annotations

import hashlib
from pathlib import Path

from smol.tokenizer import EOT_TOKEN, Tokenizer

BPE_TRAIN_CHARS = 1 << 28  # bpe:N learns its merges from the first 256 M characters


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.backend.to_str().encode()).hexdigest()


def train_tokenizer(spec: str, docs) -> Tokenizer:
    """bpe:N: a byte-level BPE of N tokens learnt from the training documents (the
    first BPE_TRAIN_CHARS characters of them)."""
    from smol.data import train_bpe

    def sample():
        seen = 0
        for text in docs:
            yield text
            seen += len(text)
            if seen >= BPE_TRAIN_CHARS:
                return

    backend = train_bpe(sample(), int(spec.split(":", 1)[1]))
    return Tokenizer(backend, bos_token=None, eos_token=EOT_TOKEN)


def load_tokenizer(spec: str) -> Tokenizer:
    """A tokenizer named by --tokenizer (not bpe:N): shakespeare, smollm2, a Hugging
    Face tokenizer folder or a tokenizer.json file."""
    from smol.data import load_tokenizer as named

    if spec in ("shakespeare", "smollm2"):
        return named(spec)
    path = Path(spec)
    if path.is_dir():
        tokenizer = Tokenizer.from_folder(path)
    else:
        from tokenizers import Tokenizer as Backend

        try:
            backend = Backend.from_file(str(path))
        except Exception as e:  # tokenizers raises a plain Exception
            raise ValueError(f"{path} is not a readable tokenizer ({e})") from None
        tokenizer = Tokenizer(backend, bos_token=None, eos_token=EOT_TOKEN)
    if tokenizer.eot_id is None:
        raise ValueError(
            f"tokenizer {spec} has no {EOT_TOKEN} token, which separates documents"
        )
    return tokenizer


def check_fits(tokenizer: Tokenizer, vocab_size: int, what: str) -> None:
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(
            f"{what} has {tokenizer.vocab_size} tokens; the model's vocab_size is "
            f"{vocab_size}: give a model that large (--set vocab_size="
            f"{tokenizer.vocab_size}) or a smaller tokenizer"
        )


def init_model(cfg):
    """(model, tokenizer) of cfg.init, in float32 on the CPU, the tokenizer checked
    against cfg.tokenizer where one was named: a model trains on its own only."""
    from smol.pretrained import load_pretrained

    source = None if cfg.init == "smollm2" else cfg.init
    model, tokenizer = load_pretrained(source, device="cpu")
    if cfg.tokenizer != "auto":
        named = load_tokenizer(cfg.tokenizer)
        if tokenizer_sha256(named) != tokenizer_sha256(tokenizer):
            raise ValueError(
                f"tokenizer {cfg.tokenizer} is not the tokenizer of init {cfg.init}: a "
                "model trains on its own; leave tokenizer out"
            )
    if tokenizer.eot_id is None:
        raise ValueError(
            f"the tokenizer of init {cfg.init} has no {EOT_TOKEN!r} token to separate "
            "documents"
        )
    return model.train(), tokenizer
