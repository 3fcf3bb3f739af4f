"""07 BPE: GPT-2's byte map, one training step of BPE, encoding with merge ranks, and an
encoder that applies its merges in the wrong order."""

from collections import Counter
from functools import lru_cache

from smol.bpe import bytes_to_unicode as reference_byte_map, count_pairs, merge
from smol.grading.registry import probe_check, task

task("byte_map", "bpe", "bytes_to_unicode(): GPT-2's printable byte map")
task("merge_step", "bpe", "merge_step(word_counts, new_id): one step of BPE training")
task("bpe_encode", "bpe", "encode_ids(ids, ranks): merges applied by rank")
task(
    "bpe_bug", "bpe", "Find the bug: an encoder applying its merges in the wrong order"
)


def _table(fn, _):
    """Probe side: the student's byte map."""
    return fn()


def _judge_distinct(inputs, table):
    assert isinstance(table, dict), f"expected a dict, got {type(table).__name__}"
    assert sorted(table) == list(range(256)), "the keys should be the bytes 0..255"
    assert all(isinstance(c, str) and len(c) == 1 for c in table.values()), (
        "every value should be a single character"
    )
    assert len(set(table.values())) == 256, "two bytes share a character"


probe_check(
    "byte_map",
    "256 distinct characters, one per byte",
    1,
    "return a dict {byte (0-255): a one-character str}, no character used twice",
    judge=_judge_distinct,
)(_table)


def _judge_printable(inputs, table):
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    wrong = [b for b in printable if table.get(b) != chr(b)]
    assert not wrong, (
        f"{len(wrong)} printable bytes map elsewhere, e.g. {wrong[0]:#04x}"
    )


probe_check(
    "byte_map",
    "printable bytes ('!'-'~', '¡'-'¬', '®'-'ÿ') stand for themselves",
    1,
    "chr(b) for b in 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF",
    judge=_judge_printable,
)(_table)


def _judge_others(inputs, table):
    want = reference_byte_map()
    wrong = [b for b in range(256) if table.get(b) != want[b]]
    assert not wrong, (
        f"byte {wrong[0]:#04x} maps to {table.get(wrong[0])!r}, "
        f"expected {want[wrong[0]]!r}"
    )


probe_check(
    "byte_map",
    "the other 68 bytes take U+0100, U+0101, ... in byte order (space -> 'Ġ')",
    2,
    "count the non-printable bytes in increasing order: the n-th gets chr(256 + n)",
    judge=_judge_others,
)(_table)


def _reference_step(word_counts, new_id):
    """The most frequent pair (ties: the smallest), counted by smol.bpe.count_pairs,
    and the word counts once it is merged."""
    pairs, _ = count_pairs([list(w) for w in word_counts], list(word_counts.values()))
    best = min(pairs, key=lambda p: (-pairs[p], p))
    merged = Counter()
    for word, count in word_counts.items():
        merged[tuple(merge(list(word), best, new_id))] += count
    return best, dict(merged)


def _step(out, word_counts, new_id):
    """Judge side: merge_step's result `out` for these word counts."""
    assert isinstance(out, tuple) and len(out) == 2, (
        f"merge_step should return (pair, new word_counts), got {type(out).__name__}"
    )
    pair, merged = out
    want_pair, want = _reference_step(word_counts, new_id)
    assert tuple(pair) == want_pair, f"merged the pair {pair}, expected {want_pair}"
    got = {tuple(w): c for w, c in merged.items()}
    assert got == want, f"the words after the merge are {got}, expected {want}"


def _steps(fn, cases):
    """Probe side: merge_step on each (word_counts, new_id)."""
    return [fn(dict(word_counts), new_id) for word_counts, new_id in cases]


def _judge_steps(cases, outs):
    for (word_counts, new_id), out in zip(cases, outs, strict=True):
        _step(out, word_counts, new_id)


probe_check(
    "merge_step",
    "merges the pair that occurs most often, counting each word's count and every "
    "occurrence in a word, overlapping ones too",
    2,
    "for every position i of a word add the word's count to the pair (word[i], "
    "word[i + 1]): a pair that occurs twice in a word counts twice, and (1, 1, 1) "
    "holds (1, 1) twice; take the largest sum",
    inputs=lambda: [
        ({(1, 2, 3): 5, (2, 3): 4, (1, 2): 2}, 9),  # (2, 3): 9 beats (1, 2): 7
        ({(1, 2, 3): 1, (1, 2): 3, (3,): 7}, 9),  # (1, 2): 4
        # each winner below wins only if every occurrence counts: counted once per
        # word, or without overlaps, (5, 6) would win with 3
        ({(1, 2, 1, 2): 2, (5, 6): 3}, 9),  # (1, 2): 2 + 2 = 4
        ({(7, 7, 7): 2, (5, 6): 3}, 9),  # (7, 7): 2 + 2 = 4
    ],
    judge=_judge_steps,
)(_steps)

probe_check(
    "merge_step",
    "overlapping pairs merge left to right: (1, 1, 1) -> (9, 1)",
    1,
    "scan each word from the left; after a merge, jump past both symbols",
    inputs=lambda: [({(1, 1, 1): 2, (1, 1, 1, 1): 1, (2, 1): 1}, 9)],
    judge=_judge_steps,
)(_steps)

probe_check(
    "merge_step",
    "ties go to the smallest (left id, right id), as in `tokenizers`",
    1,
    "among pairs with the same count take min(pair): compare ids, not the order seen",
    inputs=lambda: [
        ({(7, 8): 3, (5, 6): 3, (5, 9): 3}, 20),  # (5, 6) < (5, 9) < (7, 8)
        ({(4, 2): 1, (3, 4): 1}, 10),  # (3, 4)
    ],
    judge=_judge_steps,
)(_steps)


@lru_cache(maxsize=1)
def _small_bpe():
    """A 400-token BPE trained on the start of a play, and its text's distinct words."""
    from smol.bpe import pre_tokenize, train
    from smol.data import split_plays

    text = split_plays("val")[0][:30_000]
    bpe = train(text, 400)
    return bpe, sorted(set(pre_tokenize(text)))[:400]


BOTH = ("bpe_encode", "bpe_bug")


def _encoding_check(name, points, hint, cases, message):
    """A check of encode_ids on (ids, ranks, the encoding wanted) cases; the probe
    sees the ids and ranks only. `message` says how a result differs."""

    def judge(inputs, outs):
        for (ids, ranks, want), got in zip(cases, outs, strict=True):
            assert list(got) == want, message.format(
                ids=ids, ranks=ranks, got=got, want=want
            )

    probe_check(
        BOTH,
        name,
        points,
        hint,
        inputs=lambda: [(ids, ranks) for ids, ranks, _ in cases],
        judge=judge,
    )(lambda fn, inputs: [fn(list(ids), ranks) for ids, ranks in inputs])


_encoding_check(
    "one merge, no merge, one symbol, no symbols",
    1,
    "loop while some adjacent pair has a rank; return the ids when none has",
    [
        (ids, {(1, 2): (0, 9)}, want)
        for ids, want in (([1, 2, 3], [9, 3]), ([3, 3], [3, 3]), ([5], [5]), ([], []))
    ],
    "encode_ids({ids}, {ranks}) gave {got}, expected {want}",
)
_encoding_check(
    "a token made by one merge takes part in the next",
    1,
    "after each merge, look at the new pairs again",
    [([1, 2, 3, 1, 2], {(1, 2): (0, 9), (9, 3): (1, 10)}, [10, 9])],
    "encode_ids gave {got}, expected [10, 9]",
)


LEFT_ALONE = [1, 2, 3, 1, 2]  # merged twice in place by ids[i : i + 2] = [new_id]


def _judge_left_alone(inputs, after):
    assert list(after) == LEFT_ALONE, (
        f"encode_ids changed the caller's list {LEFT_ALONE} into {after}"
    )


@probe_check(
    BOTH,
    "the caller's ids are left unchanged",
    1,
    "build new lists (merge returns one; or ids = list(ids) first): ids[i : i + 2] = "
    "[new_id] rewrites the list the caller passed",
    judge=_judge_left_alone,
)
def _(fn, _):
    ids = list(LEFT_ALONE)
    fn(ids, {(1, 2): (0, 9), (9, 3): (1, 10)})
    return ids


def _lowest_rank_inputs():
    bpe, words = _small_bpe()
    return {
        "ranks": bpe.ranks,
        "words": [(w, [bpe.byte_ids[b] for b in w.encode("utf-8")]) for w in words],
    }


def _judge_lowest_rank(inputs, out):
    got = out["ranked"]
    assert list(got) == [1, 10], (
        f"with (2, 3) ranked before (1, 2), got {got}, expected [1, 10]"
    )
    bpe, _ = _small_bpe()
    for (word, _), got in zip(inputs["words"], out["words"], strict=True):
        want = bpe.encode_pre_token(word)
        assert list(got) == want, f"{word!r} gave {got}, smol's BPE gives {want}"


@probe_check(
    BOTH,
    "the lowest rank first: equals smol's BPE on 400 words of a play",
    3,
    "of all adjacent pairs that have a merge, take the one of the lowest rank, "
    "wherever it stands, not the leftmost one",
    inputs=_lowest_rank_inputs,
    judge=_judge_lowest_rank,
)
def _(fn, inputs):
    ranked = fn([1, 2, 3], {(1, 2): (1, 9), (2, 3): (0, 10)})
    words = [fn(list(ids), inputs["ranks"]) for _, ids in inputs["words"]]
    return {"ranked": ranked, "words": words}
