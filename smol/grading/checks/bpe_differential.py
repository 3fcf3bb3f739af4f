"""07 BPE, merge_step and encode_ids against smol's on generated inputs
(`_differential`). merge_step: words of one to seven symbols over alphabets of one
to five ("aaa": pairs that overlap), counts that tie, words without a pair; the
pair and every word's count after the merge compared. encode_ids: merge tables
whose ranks are not in the order of the ids they make, tokens made by one merge
taking part in the next, repeated symbols, symbols in no merge, no symbol or one;
and words of text (accents, CJK, emoji, spaces) as bytes through a BPE trained on
a play; the ids compared. bytes_to_unicode
takes no input: its check compares all 256 characters with smol's."""

from types import SimpleNamespace

import torch

from smol.bpe import BPE
from smol.grading.checks import _differential as diff
from smol.grading.checks.bpe import BOTH, _reference_step, _small_bpe

NAME = "generated inputs: values equal smol's"
CASES = 40
WORDS = ("naïve", "日本語", "🙂🙂", " aaaa", "   ", "x", "e\u0301t\u00e9", "", "thee")


def _case(what: str, args: dict) -> dict:
    return {
        "what": what,
        "args": args,
        "grad": [],
        "up": [None, None],
        "tol": (0.0, 0.0),
    }


def _word(g, alphabet: int, longest: int) -> tuple:
    n = int(torch.randint(1, longest + 1, (), generator=g))
    return tuple(torch.randint(0, alphabet, (n,), generator=g).tolist())


def _step_case(g) -> dict:
    alphabet = diff.pick(g, (1, 2, 3, 5))
    counts = {}
    for _ in range(diff.pick(g, (1, 2, 4, 6))):
        counts[_word(g, alphabet, 7)] = int(torch.randint(1, 4, (), generator=g))
    pairless = [w for w in counts if len(w) < 2]
    if len(pairless) == len(counts):  # one pair at least: there is a merge to make
        counts[_word(g, alphabet, 3) + (0,)] = 1
    new_id = alphabet + diff.pick(g, (0, 7))
    return _case(
        f"word_counts {counts}, new_id {new_id}",
        {"word_counts": counts, "new_id": new_id},
    )


def _flat(counts: dict) -> torch.Tensor:
    """Word counts as one tensor: each word, -1, its count, -2, words sorted."""
    out = []
    for word, count in sorted((tuple(w), c) for w, c in counts.items()):
        out += [*word, -1, count, -2]
    return torch.tensor(out, dtype=torch.long)


def _call_step(fn, args):
    pair, merged = fn(dict(args["word_counts"]), args["new_id"])
    return [torch.tensor(tuple(pair), dtype=torch.long), _flat(merged)]


def _table(g, alphabet: int) -> dict:
    """Merges of the alphabet's symbols and of the tokens made before, ranks in
    their order of making, the ids made not in that order."""
    n = diff.pick(g, (1, 3, 6))
    made = (100 + torch.randperm(n, generator=g)).tolist()
    symbols, ranks = list(range(alphabet)), {}
    for rank, new_id in enumerate(made):
        pair = tuple(diff.pick(g, symbols) for _ in range(2))
        if pair not in ranks:
            ranks[pair] = (rank, new_id)
            symbols.append(new_id)
    return ranks


def _encode_case(g) -> dict:
    if torch.rand((), generator=g) < 0.3:  # a word of text, through a real BPE
        bpe, _ = _small_bpe()
        word = diff.pick(g, WORDS)
        ids = [bpe.byte_ids[b] for b in word.encode("utf-8")]
        return _case(f"{word!r} as bytes {ids}", {"ids": ids, "ranks": bpe.ranks})
    alphabet = diff.pick(g, (1, 2, 3))
    ranks = _table(g, alphabet)
    n = diff.pick(g, (0, 1, 2, 5, 9))
    ids = torch.randint(0, alphabet + 1, (n,), generator=g).tolist()  # alphabet: none
    return _case(f"ids {ids}, ranks {ranks}", {"ids": ids, "ranks": ranks})


def _call_encode(fn, args):
    out = fn(list(args["ids"]), args["ranks"])
    return [torch.tensor(list(out), dtype=torch.long)]


def _smol_step():
    return _reference_step


def _smol_encode():
    return lambda ids, ranks: BPE.apply_merges(SimpleNamespace(ranks=ranks), ids)


diff.register(
    "merge_step",
    NAME,
    1,
    "the case named below differs from smol's step: count every adjacent pair of "
    "every word times its count (overlapping ones too), take the most frequent, "
    "ties to the smallest pair; merge it left to right in every word, adding the "
    "counts of words that become the same",
    _step_case,
    _call_step,
    _smol_step,
    CASES,
)
diff.register(
    BOTH,
    NAME,
    1,
    "the case named below differs from smol.bpe.BPE.apply_merges: merge the "
    "adjacent pair of the lowest rank, everywhere it stands, then look again, "
    "until no pair has a merge",
    _encode_case,
    _call_encode,
    _smol_encode,
    CASES,
)
