"""SmolLM2's byte-level BPE by hand: byte map, pre-tokenizer, merges, encode, train.

Text becomes token ids in four steps. Special tokens (`<|im_start|>`, ...) are cut out
whole. The rest is split into pre-tokens: every digit on its own, then GPT-2's pattern
(words with their leading space, numbers, runs of punctuation, runs of whitespace). Each
pre-token's UTF-8 bytes start as one symbol each, written as printable characters
(GPT-2's byte map), and the merges are applied, lowest rank first, until none applies.
Training learns the merges: again and again, the most frequent adjacent pair becomes a
new token.

    from smol.bpe import BPE
    BPE.from_pretrained().encode("Hello world")  # [19556, 905], as SmolLM2's tokenizer
"""

from __future__ import annotations

import heapq
import json
import numbers
from collections import Counter, defaultdict
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

import regex

# GPT-2's split: contractions, letters, numbers and other symbols (each with one
# optional leading space), whitespace before whitespace, then any remaining whitespace.
GPT2_SPLIT = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
DIGIT = regex.compile(r"(\p{N})")  # SmolLM2 isolates every digit before GPT-2's split
NO_MERGE = (float("inf"), -1)  # the rank of a pair that no merge joins
Pair = tuple[int, int]  # two adjacent token ids


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte map: byte -> a printable character. The 188 printable Latin-1
    bytes stand for themselves; the 68 others (controls, space, ...) take the characters
    from U+0100 on, in order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, shifted = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + shifted)
            shifted += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def pre_tokenize(text: str, split_digits: bool = True) -> list[str]:
    """The pre-tokens of text (no special tokens in it): digits one by one, then GPT-2's
    split on what lies between them. Two passes matter: ' 7' stays two pre-tokens."""
    if not isinstance(text, str):
        raise TypeError(f"expected text as str, got {type(text).__name__}")
    pieces = DIGIT.split(text) if split_digits else [text]
    return [p for piece in pieces if piece for p in GPT2_SPLIT.findall(piece)]


def merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """ids with each occurrence of pair, left to right, not overlapping, made new_id."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def special_split(special_tokens: Iterable[str]) -> regex.Pattern | None:
    """A pattern whose split cuts text at the special tokens and keeps them as the odd
    parts, or None without special tokens. Longest first: where one special token
    starts another, the longer one wins."""
    alternatives = sorted(special_tokens, key=len, reverse=True)
    if not alternatives:
        return None
    return regex.compile("(" + "|".join(map(regex.escape, alternatives)) + ")")


class BPE:
    """A byte-level BPE: vocab {token: id} in GPT-2's byte-mapped characters, merges in
    rank order (the first is applied first), special tokens matched whole anywhere."""

    def __init__(
        self,
        vocab: dict[str, int],
        merges: list[tuple[str, str]],
        special_tokens: Iterable[str] = (),
        split_digits: bool = True,
    ):
        self.vocab, self.split_digits = dict(vocab), split_digits
        check_vocab(self.vocab)
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        # A byte without a symbol in vocab is dropped, as `tokenizers` does without an
        # unknown token: SmolLM2 lacks 21 bytes its training data never held (0x04, ...)
        self.byte_ids = [self.vocab.get(BYTE_TO_CHAR[b]) for b in range(256)]
        # a pair of ids -> (its merge's rank, the id of the merged token)
        self.ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, pair in enumerate(merges):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ValueError(f"merge {rank} must be a pair of tokens, got {pair!r}")
            a, b = pair
            if a not in self.vocab or b not in self.vocab or a + b not in self.vocab:
                raise ValueError(
                    f"merge {rank} ({a!r}, {b!r}) uses a token not in vocab"
                )
            self.ranks[self.vocab[a], self.vocab[b]] = (rank, self.vocab[a + b])
        self.merges = list(merges)
        special_tokens = check_special_tokens(special_tokens)
        missing = [t for t in special_tokens if t not in self.vocab]
        if missing:
            raise ValueError(f"special tokens {missing} are not in vocab")
        self.special = {t: self.vocab[t] for t in special_tokens}
        self.special_split = special_split(self.special)
        self.cache: dict[str, list[int]] = {}  # pre-token -> ids: words repeat

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return (
            f"BPE(vocab={len(self.vocab)}, merges={len(self.merges)}, "
            f"special={len(self.special)}, split_digits={self.split_digits})"
        )

    def apply_merges(self, ids: list[int]) -> list[int]:
        """ids with the lowest-ranked pair merged, again and again, until none is."""
        while len(ids) > 1:
            pair = min(pairwise(ids), key=lambda p: self.ranks.get(p, NO_MERGE))
            if pair not in self.ranks:
                break
            ids = merge(ids, pair, self.ranks[pair][1])
        return ids

    def encode_pre_token(self, piece: str) -> list[int]:
        """One pre-token: its bytes as symbols, then the merges."""
        ids = [self.byte_ids[b] for b in piece.encode("utf-8")]
        return self.apply_merges([i for i in ids if i is not None])

    def encode(self, text: str) -> list[int]:
        """Token ids of text; special tokens written in it become their own ids."""
        if not isinstance(text, str):
            raise TypeError(f"expected text as str, got {type(text).__name__}")
        parts = self.special_split.split(text) if self.special_split else [text]
        ids = []
        for i, part in enumerate(parts):
            if i % 2:  # the split's captured separators: special tokens
                ids.append(self.special[part])
                continue
            for piece in pre_tokenize(part, self.split_digits):
                if piece not in self.cache:
                    self.cache[piece] = self.encode_pre_token(piece)
                ids.extend(self.cache[piece])
        return ids

    def token_bytes(self, i: int) -> bytes:
        """The bytes token i stands for (a special token: its text in UTF-8)."""
        is_int = isinstance(i, numbers.Integral) and not isinstance(i, bool)
        token = self.id_to_token.get(i) if is_int else None
        if token is None:
            raise ValueError(
                f"expected token ids in 0..{len(self.vocab) - 1}, got {i!r}"
            )
        if token in self.special:
            return token.encode("utf-8")
        return bytes(CHAR_TO_BYTE[c] for c in token)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ids (ints, or a tensor or array of them); bytes that are not
        valid UTF-8 become U+FFFD."""
        if isinstance(ids, str):
            raise TypeError(f"expected token ids, got the str {ids[:40]!r}")
        ids = ids.tolist() if hasattr(ids, "tolist") else ids  # a tensor, an array
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", "replace")

    @classmethod
    def from_pretrained(cls, source: str | Path | None = None) -> BPE:
        """SmolLM2's tokenizer from source: None (the GGUF file load_pretrained reads,
        else the hub's tokenizer.json), a .gguf file, or a Hugging Face folder (or its
        tokenizer.json)."""
        if source is None:
            from smol.gguf import bundled_gguf_path
            from smol.pretrained import HUB_ID

            source = bundled_gguf_path()
            if source is None:  # e.g. in Colab: the same tokenizer from the hub
                from huggingface_hub import hf_hub_download

                source = hf_hub_download(HUB_ID, "tokenizer.json")
        path = Path(source)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                "expected a .gguf file, a tokenizer.json or a folder holding one, "
                f"got {source}"
            )
        from smol.gguf import GGUFFile
        from smol.tokenizer import bpe_fields_from_gguf, bpe_fields_from_json

        if path.suffix == ".gguf":
            return cls(**bpe_fields_from_gguf(GGUFFile(path).metadata, path))
        if path.suffix != ".json":
            raise ValueError(f"expected a .gguf or a tokenizer.json file, got {path}")
        spec = json.loads(path.read_text(encoding="utf-8"))
        return cls(**bpe_fields_from_json(spec))


def check_vocab(vocab: dict) -> None:
    """A ValueError unless vocab maps str tokens to ids >= 0, each id once."""
    tokens = {}  # id -> token
    for token, i in vocab.items():
        if not isinstance(token, str) or not isinstance(i, int) or i < 0:
            raise ValueError(f"vocab must map str to ids >= 0, got {token!r}: {i!r}")
        if i in tokens:
            raise ValueError(f"tokens {tokens[i]!r} and {token!r} share the id {i}")
        tokens[i] = token


def check_special_tokens(special_tokens: Iterable[str]) -> list[str]:
    """The special tokens as a list, each a non-empty str, none twice."""
    if isinstance(special_tokens, str):
        raise TypeError(
            f"special_tokens must be a list of str, got the str {special_tokens!r}"
        )
    special_tokens = list(special_tokens)
    for t in special_tokens:
        if not isinstance(t, str) or not t:
            raise ValueError(f"a special token must be a non-empty str, got {t!r}")
    if len(set(special_tokens)) < len(special_tokens):
        raise ValueError(f"special tokens repeat: {special_tokens}")
    return special_tokens


def count_pre_tokens(
    texts: Iterable[str], special_tokens: list[str], split_digits: bool
) -> Counter[str]:
    """How often each pre-token occurs in the texts; special tokens are cut out whole
    and never counted."""
    cut = special_split(special_tokens)
    counts = Counter()
    for document in texts:
        # the even parts of the split: the text between the special tokens
        for part in cut.split(document)[::2] if cut else [document]:
            counts.update(pre_tokenize(part, split_digits))
    return counts


def count_pairs(
    words: list[list[int]], freqs: list[int]
) -> tuple[dict[Pair, int], dict[Pair, set[int]]]:
    """Each adjacent pair's count over the corpus (a word counts as often as it occurs),
    and the words (their indices) that hold it."""
    pair_counts: dict[Pair, int] = defaultdict(int)
    where: dict[Pair, set[int]] = defaultdict(set)
    for i, word in enumerate(words):
        for pair in pairwise(word):
            pair_counts[pair] += freqs[i]
            where[pair].add(i)
    return pair_counts, where


def pop_most_frequent(heap: list, pair_counts: dict[Pair, int]) -> Pair | None:
    """The most frequent pair, taken off the heap (None when no pair is left). An entry
    whose count has fallen since it was pushed is stale: it goes back with its count as
    it is now, and the search goes on."""
    while heap:
        negative, pair = heapq.heappop(heap)
        if -negative == pair_counts[pair]:
            return pair
        if pair_counts[pair] > 0:
            heapq.heappush(heap, (-pair_counts[pair], pair))
    return None


def merge_words(
    words: list[list[int]],
    freqs: list[int],
    where: dict[Pair, set[int]],
    pair: Pair,
    new_id: int,
) -> dict[Pair, int]:
    """Apply one merge to the words that hold pair, in place, and return how much each
    pair's count changed. Only these words are revisited: their old pairs are taken
    away, their new pairs added, and where learns which words hold the new token."""
    delta: dict[Pair, int] = defaultdict(int)
    for i in where.pop(pair, ()):
        old, words[i] = words[i], merge(words[i], pair, new_id)
        for p in pairwise(old):
            delta[p] -= freqs[i]
        for p in pairwise(words[i]):
            delta[p] += freqs[i]
            if new_id in p:  # the only pairs this word did not hold before
                where[p].add(i)
    return delta


def train(
    text: str | Iterable[str],
    vocab_size: int,
    special_tokens: Iterable[str] = (),
    split_digits: bool = True,
) -> BPE:
    """Learn merges from text (a string or a list of documents) until the vocabulary
    holds vocab_size tokens (or no pair is left).

    Ids: the special tokens first, then the 256 byte symbols in the order of their
    characters' code points, then each merged token as it is made, as `tokenizers`'
    BpeTrainer numbers them. Tie-breaking: of the pairs with the highest count, the one
    with the smallest (left id, right id) is merged first, as in `tokenizers`. Counts
    are updated, not recounted: a merge revisits only the words that hold the pair, and
    a heap finds the next best pair.
    """
    if isinstance(text, str):
        text = [text]
    if isinstance(text, (bytes, bytearray)):
        raise TypeError("text must be a str or a list of str, got bytes: decode it")
    special_tokens = check_special_tokens(special_tokens)
    tokens = special_tokens + sorted(BYTE_TO_CHAR.values())
    clash = sorted(set(special_tokens) & set(BYTE_TO_CHAR.values()))
    if clash:
        raise ValueError(
            f"special tokens {clash} are byte symbols: a special token needs a name "
            "of its own"
        )
    if not isinstance(vocab_size, int) or vocab_size < len(tokens):
        raise ValueError(
            f"vocab_size must be an int of at least {len(tokens)} (the special tokens "
            f"and 256 bytes), got {vocab_size!r}"
        )
    vocab = {t: i for i, t in enumerate(tokens)}
    word_counts = count_pre_tokens(text, special_tokens, split_digits)
    words = [[vocab[BYTE_TO_CHAR[b]] for b in w.encode("utf-8")] for w in word_counts]
    freqs = list(word_counts.values())
    pair_counts, where = count_pairs(words, freqs)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    merges = []
    while len(vocab) < vocab_size:
        pair = pop_most_frequent(heap, pair_counts)
        if pair is None:
            break
        a, b = tokens[pair[0]], tokens[pair[1]]
        if a + b not in vocab:  # two merge paths can spell one token: it keeps its id
            vocab[a + b] = len(tokens)
            tokens.append(a + b)
        merges.append((a, b))
        for p, change in merge_words(words, freqs, where, pair, vocab[a + b]).items():
            pair_counts[p] += change
            if change > 0:  # a count that rose goes into the heap, as it is now
                heapq.heappush(heap, (-pair_counts[p], p))
    return BPE(vocab, merges, special_tokens, split_digits)
