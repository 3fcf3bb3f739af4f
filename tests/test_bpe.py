"""smol.bpe, proven: the hand-written BPE gives SmolLM2's ids on hundreds of varied
strings, its training equals `tokenizers`' BpeTrainer, and three classic bugs fail."""

from __future__ import annotations

import json
import random
from itertools import pairwise

import pytest
import regex

import smol.bpe
from smol.bpe import BPE, BYTE_TO_CHAR, bytes_to_unicode, merge, pre_tokenize, train
from smol.data import EOT, asset, split_plays

CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
HANDWRITTEN = [
    # English
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a "
    "good fortune, must be in want of a wife.",
    "I'm you're they'll we've she'd he's WE'VE THEY'LL I'M",
    "don't won't can't shouldn't y'all o'clock rock'n'roll",
    "CamelCaseWords and snake_case_words and kebab-case-words",
    "Mr. Smith went to Washington, D.C., on Jan. 5th.",
    "hyphen-ated, em—dash, en–dash, ellipsis… and “curly” ‘quotes’",
    "To be, or not to be, that is the question:",
    "ALL CAPS SHOUTING!!! and lowercase whispering...",
    "a",
    "A",
    "Supercalifragilisticexpialidocious",
    "antidisestablishmentarianism",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#top",
    "user@example.com, +1 (555) 010-9999",
    # code, with tabs and runs of spaces
    "def f(x):\n    return x ** 2  # square\n",
    "\tif (a && b) {\n\t\treturn c;\n\t}\n",
    "for i in range(10):\n        print(i, end='')\n",
    'int main(void) { printf("%d\\n", 42); return 0; }',
    "x = [1, 2, 3]\ny = {'a': 1, \"b\": 2}\nz = (x, y)",
    "SELECT * FROM users WHERE id = 7 AND name LIKE '%smol%';",
    '<div class="row"><span>text</span></div>',
    "    \n        \n\t\t\n",
    '#!/usr/bin/env bash\nset -euo pipefail\necho "$HOME"\n',
    "lambda x: x if x else None  ;;  ::  ->  =>  !=  ==  <=  >=",
    "/* comment */ // another\n-- sql comment\n% latex",
    "\\begin{equation} e^{i\\pi} + 1 = 0 \\end{equation}",
    "fn main() {\n    let v: Vec<u8> = vec![0u8; 1024];\n}",
    "a  b   c    d     e      f",
    "trailing spaces   \nand\ttabs\t\t\n",
    # digits and long numbers
    "0",
    "1234567890",
    "3.14159265358979323846",
    "1,000,000 and 1.000.000 and 1 000 000",
    "2024-11-30T14:50:32Z",
    "0x1F 0b1010 0o777 1e-5 6.02e23",
    "Call 0800 123 456 or +44 20 7946 0958",
    "x1 y22 z333 v4.5.6 ipv4 192.168.0.1",
    "12345678901234567890123456789012345678901234567890",
    "  12",
    "a  1",
    "a\n\n2024",
    "a 1 2  3   4",
    "$5.99 €10 £3 ¥100 ₹50",
    "½ ¾ ² ³ ¹ ⅓ Ⅻ ⅷ",
    "٠١٢٣٤٥٦٧٨٩ and ०१२३४५६७८९ and 〇一二三",
    "１２３ full-width digits",
    # punctuation runs
    "!!!???...,,,;;;:::",
    "-----=====*****#####",
    "((([[[{{{}}}]]])))",
    "'''\"\"\"```",
    "...!?!?...",
    "~`@#$%^&*()_+-=",
    "'s 't 're 've 'm 'll 'd",
    "''s ''t 'S 'T",
    # accented and non-Latin scripts
    "naïve café résumé façade coöperate",
    "Ångström Øresund Ærø straße",
    "Ελληνικά: Γειά σου Κόσμε",
    "Привет, мир! Как дела?",
    "Українська мова ґ є і ї",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "हिन्दी में लिखा गया वाक्य।",
    "こんにちは世界",
    "日本語のテキストとカタカナ",
    "你好，世界！",
    "中文标点：“你好”、《书名》",
    "안녕하세요 세계",
    "ภาษาไทย",
    "ქართული ენა",
    "Հայերեն",
    "አማርኛ",
    "Tiếng Việt có dấu",
    "Türkçe ğüşıöç İ",
    "Polski: zażółć gęślą jaźń",
    # emoji
    "emoji 🤗🚀",
    "family 👩‍👩‍👧‍👦",
    "flag 🇫🇷🇯🇵🇺🇸",
    "skin tones 👍🏻👍🏿",
    "rainbow flag 🏳️‍🌈",
    "keycap 1️⃣ #️⃣",
    "👨‍💻 coding",
    "❤️ heart and ♥ suit",
    "🙂🙃😉😊😇🥰😍🤩",
    # the chat template's special tokens
    CHAT,
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|><|im_end|>",
    "x<|im_end|>y",
    "<|im_start|",
    "|im_start|>",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|><jupyter_code>x=1<jupyter_output>",
    "<repo_name>smol<file_sep>bpe.py<filename>a",
    "<empty_output> <gh_stars>100",
    "<|im_end|><|im_end|><|im_end|>",
    " <|im_start|> ",
    "<|IM_START|>",
    # empty and whitespace only
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r\n\r\n",
    " \n ",
    "\t \t",
    "\u00a0",
    "\u3000",
    " \u00a0 ",
    # unicode edge cases
    "a\u0301e\u0308o\u0302",
    "e\u0301\u0301\u0301",
    "\u0300 leading combining mark",
    "zero\u200bwidth\u200cjoiner\u200d",
    "bom\ufeffinside",
    "\ufeffbom at start",
    "line\u2028separator\u2029paragraph",
    "nbsp\u00a0between\u00a0words",
    "soft\u00adhyphen",
    "rtl \u202eoverride\u202c and \u200fmark",
    "tag chars \U000e0041\U000e0042",
    "private use \ue000\uf8ff",
    "noncharacters \ufdd0\ufffe\uffff",
    "\U0010ffff last code point",
    "\U0001d11e musical and \U0001f600",
    "mathematical 𝐀𝐁𝐂 𝔸𝔹ℂ",
    "\x00\x01\x7f nul and del",
    "bell\x07 tab\x09 vt\x0b ff\x0c",
    "\x1c\x1e\x1f separators",
    "\x85 next line",
    "\u1680 ogham space",
    "\u180e mongolian vowel separator",
    "\u2000\u2001\u2002\u2003\u2009\u200a spaces",
    "\u202f\u205f narrow spaces",
    "ÿþ control",
    "Ā ā Ġ ġ Ċ",  # the byte map's own stand-ins, as plain text
    "\U00020000 CJK extension B",
    "mixed: Hello, мир, 世界, عالم, 123!",
]
# Bytes SmolLM2's vocabulary has no symbol for: both tokenizers drop them.
DROPPED = [
    "a\x04b",
    "!\x04!",
    "é\x04",
    "--\x13--",
    "\x06\x14\x16\x1d",
    "plane 5 \U00050000 and plane 9 \U00090000",
]


def generated(n: int = 80, seed: int = 0) -> list[str]:
    """Random strings from a pool that mixes every category above."""
    pool = (
        list("abcxyzABCXYZ0123456789 \t\n.,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`")
        + list("éüßøñçÅΩπЖжשمनक日本語한글ไ")
        + ["  ", "    ", "\r\n", "\u00a0", "\u200d", "\u0301", "🤗", "👩‍💻", "🇫🇷"]
        + ["'s", "'ll", "<|im_end|>", "<|im_start|>", "<|endoftext|>", "123", " 4"]
    )
    rng = random.Random(seed)
    return ["".join(rng.choices(pool, k=rng.randint(1, 40))) for _ in range(n)]


TEXTS = HANDWRITTEN + generated()


@pytest.fixture(scope="module")
def bpe():
    return BPE.from_pretrained()


@pytest.fixture(scope="module")
def real():
    """SmolLM2's tokenizer as smol.tokenizer builds it (`tokenizers`) from the GGUF."""
    from smol.gguf import GGUFFile, bundled_gguf_path, tokenizer_from_gguf

    return tokenizer_from_gguf(GGUFFile(bundled_gguf_path()))


def mismatches(bpe, real, texts=TEXTS) -> list[str]:
    return [t for t in texts if bpe.encode(t) != real.encode(t)]


def test_the_proof_covers_at_least_200_varied_strings():
    assert len(set(TEXTS)) >= 200
    assert "" in TEXTS and CHAT in TEXTS and any("\u200d" in t for t in TEXTS)


def test_ids_equal_smollm2s_tokenizer(bpe, real):
    assert mismatches(bpe, real, TEXTS + DROPPED) == []


def test_decode_inverts_encode(bpe, real):
    for text in TEXTS:
        ids = bpe.encode(text)
        assert bpe.decode(ids) == text == real.decode(ids), repr(text)


def test_bytes_without_a_symbol_are_dropped_as_the_real_tokenizer_drops_them(bpe, real):
    missing = [b for b, c in BYTE_TO_CHAR.items() if c not in bpe.vocab]
    assert len(missing) == 21 and 0x04 in missing and 0xFF in missing
    for text in DROPPED:
        ids = bpe.encode(text)
        assert bpe.decode(ids) == real.decode(ids) != text
    assert bpe.encode("!\x04!") == bpe.encode(
        "!!"
    )  # neighbours of a dropped byte merge


def test_special_tokens_are_whole_and_never_built_by_merges(bpe):
    assert bpe.encode("<|im_start|>") == [1] and bpe.encode("<|im_end|>") == [2]
    assert len(bpe.special) == 17 and set(bpe.special.values()) == set(range(17))
    assert len(bpe.encode_pre_token("<|im_end|>")) > 1  # no merge spells it
    assert bpe.encode("x<|im_end|>y") == bpe.encode("x") + [2] + bpe.encode("y")
    assert 1 not in bpe.encode("<|im_start|")


def test_from_a_hugging_face_folder_equals_from_the_gguf(bpe, real, tmp_path):
    real.save(tmp_path)
    again = BPE.from_pretrained(tmp_path)
    assert (again.vocab, again.merges, again.special) == (
        bpe.vocab,
        bpe.merges,
        bpe.special,
    )
    assert again.split_digits and again.encode(CHAT) == bpe.encode(CHAT)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    spec["model"]["merges"] = [
        " ".join(m) for m in spec["model"]["merges"]
    ]  # old format
    spec["pre_tokenizer"] = spec["pre_tokenizer"]["pretokenizers"][1]  # ByteLevel only
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    plain = BPE.from_pretrained(tmp_path / "tokenizer.json")
    assert plain.merges == bpe.merges and not plain.split_digits


def test_transformers_gguf_tokenizer_is_the_same_bpe_without_the_digit_split(bpe):
    """transformers builds the GGUF's tokenizer with ByteLevel alone: it drops SmolLM2's
    digit split ('smollm' in llama.cpp). The hand BPE without the split equals it, and
    the two differ only where whitespace stands before a digit."""
    from transformers import AutoTokenizer

    from smol.gguf import bundled_gguf_path

    path = bundled_gguf_path()
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    plain = BPE(bpe.vocab, bpe.merges, bpe.special, split_digits=False)
    assert [t for t in TEXTS if plain.encode(t) != hf.encode(t)] == []
    differ = [t for t in TEXTS if bpe.encode(t) != hf.encode(t)]
    assert differ and all(regex.search(r"\s\p{N}", t) for t in differ)


# --- the pieces -----------------------------------------------------------------------


def test_byte_map_is_gpt2s():
    from tokenizers import pre_tokenizers

    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert (table[ord(" ")], table[ord("\n")], table[ord("a")]) == ("Ġ", "Ċ", "a")
    assert all(c.isprintable() and not c.isspace() for c in table.values())


def test_pre_tokenizer_splits_digits_first_then_gpt2s_pattern():
    assert pre_tokenize("Hello world") == ["Hello", " world"]
    assert pre_tokenize("a  1") == [
        "a",
        "  ",
        "1",
    ]  # one pass of GPT-2's regex: a, ' ', ' 1'
    assert pre_tokenize("a  1", split_digits=False) == ["a", " ", " 1"]
    assert pre_tokenize("x 2024!") == ["x", " ", "2", "0", "2", "4", "!"]
    assert pre_tokenize("I'm ok") == ["I", "'m", " ok"]
    assert pre_tokenize("") == []
    with pytest.raises(TypeError, match="expected text as str"):
        pre_tokenize(b"bytes")


def test_merge_is_left_to_right_without_overlap():
    assert merge([1, 1, 1, 2, 1, 1], (1, 1), 9) == [9, 1, 2, 9]
    assert merge([1, 2], (2, 1), 9) == [1, 2]
    assert merge([], (1, 2), 9) == []


def test_clear_errors(bpe, tmp_path):
    with pytest.raises(TypeError, match="expected text as str"):
        bpe.encode(None)
    with pytest.raises(ValueError, match="expected token ids in 0..49151"):
        bpe.decode([49152])
    with pytest.raises(FileNotFoundError, match="expected a .gguf file"):
        BPE.from_pretrained(tmp_path / "nothing")
    (tmp_path / "vocab.txt").write_text("a b")
    with pytest.raises(ValueError, match="expected a .gguf or a tokenizer.json file"):
        BPE.from_pretrained(tmp_path / "vocab.txt")
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram"}}))
    with pytest.raises(ValueError, match="expected a BPE model"):
        BPE.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocab_size must be an int of at least 257"):
        train("abc", 100, [EOT])
    with pytest.raises(ValueError, match="not in vocab"):
        BPE(bpe.vocab, [("no such token", "x")])


BYTES = {c: i for i, c in enumerate(sorted(BYTE_TO_CHAR.values()))}  # 256 symbols


@pytest.mark.parametrize(
    "make, error, says",
    [
        # one id for two tokens: decode would give only one of them back
        (lambda: BPE({**BYTES, "zz": 5}, []), ValueError, "share the id 5"),
        (lambda: BPE({**BYTES, "zz": 300.0}, []), ValueError, "'zz': 300.0"),
        (lambda: BPE({**BYTES, "": 300}, [], [""]), ValueError, "non-empty str"),
        # a str is iterable: each of its characters would become a special token
        (lambda: BPE({**BYTES, "<s>": 300}, [], "<s>"), TypeError, "the str '<s>'"),
        (lambda: BPE(BYTES, [], ["<s>"]), ValueError, r"\['<s>'\] are not in vocab"),
        (lambda: BPE(BYTES, [("a", "b", "c")]), ValueError, "merge 0 must be a pair"),
        (lambda: train("hi hi", 300, "<s>"), TypeError, "the str '<s>'"),
        (lambda: train("hi hi", 300, [""]), ValueError, "non-empty str"),
        (lambda: train("hi hi", 300, ["<s>", "<s>"]), ValueError, "repeat"),
        (lambda: train("hi hi", 300, ["h"]), ValueError, "are byte symbols"),
        (lambda: train(b"hi hi", 300), TypeError, "got bytes"),
        (lambda: train("hi hi", 300.0), ValueError, "vocab_size must be an int"),
    ],
)
def test_degenerate_vocabularies_and_special_tokens_are_refused(make, error, says):
    with pytest.raises(error, match=says):
        make()


def test_decode_takes_int_ids_only(bpe):
    with pytest.raises(ValueError, match="got 72.7"):  # int() would make it 72
        bpe.decode([72.7])
    with pytest.raises(TypeError, match="got the str '72'"):  # '7', '2' -> ids 7, 2
        bpe.decode("72")
    ids = bpe.encode("Hello world")
    torch = pytest.importorskip("torch")
    assert bpe.decode(torch.tensor(ids)) == bpe.decode(ids) == "Hello world"
    with pytest.raises(ValueError, match="expected token ids"):
        bpe.decode(torch.tensor(ids, dtype=torch.float32))


# --- training equals tokenizers' BpeTrainer -------------------------------------------


def tokenizers_train(texts, vocab_size, special_tokens, split_digits=True):
    """`tokenizers`' BpeTrainer configured as smol.bpe.train: the same pre-tokenizer,
    all 256 byte symbols, the special tokens first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    digits = pre_tokenizers.Digits(individual_digits=True)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([digits, byte_level]) if split_digits else byte_level
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


def test_training_on_the_plays_equals_the_shipped_tokenizers_bpe():
    """smol's shipped Shakespeare tokenizer is tokenizers' BpeTrainer at 4,096 tokens on
    the training plays, with GPT-2's pre-tokenizer (no digit split): the same merges."""
    shipped = json.loads(asset("shakespeare_bpe4096.json").read_text())["model"]
    ours = train(split_plays("train"), 4096, [EOT], split_digits=False)
    assert ours.vocab == shipped["vocab"]
    assert ours.merges == [tuple(m) for m in shipped["merges"]]


def test_training_with_smollm2s_pre_tokenizer_equals_tokenizers():
    texts = split_plays("val")
    vocab, merges = tokenizers_train(texts, 1000, [EOT, "<|im_start|>"])
    ours = train(texts, 1000, [EOT, "<|im_start|>"])
    assert (ours.vocab, ours.merges) == (vocab, merges)
    assert len(ours) == 1000


def test_ties_go_to_the_smallest_pair_of_ids():
    """Every pair of 'xy ab' occurs once. Ids follow the code points of the byte
    symbols: a < b < x < y < Ġ (U+0120). So (a, b) goes first, then (x, y), (Ġ, ab)."""
    ours = train("xy ab", 256 + 3)
    assert ours.merges == [("a", "b"), ("x", "y"), ("Ġ", "ab")]
    assert tokenizers_train(["xy ab"], 256 + 3, [])[1] == ours.merges


def test_training_on_random_small_corpora_equals_tokenizers():
    rng = random.Random(0)
    for _ in range(40):
        alphabet = rng.choice(["ab", "abc", "aab", "ab 1", "é😀 a"])
        words = [
            "".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(20)
        ]
        size = 256 + rng.randint(5, 40)
        ours = train(words, size)
        assert (ours.vocab, ours.merges) == tokenizers_train(words, size, []), words


# --- mutants: each classic bug fails an equality check --------------------------------


class ReversedTies:
    """heapq as train uses it, but ties go to the largest pair of ids (wrong)."""

    import heapq as _heapq

    @staticmethod
    def _flip(entry):
        count, (a, b) = entry
        return count, (-a, -b)

    @classmethod
    def heapify(cls, heap):
        heap[:] = [cls._flip(e) for e in heap]
        cls._heapq.heapify(heap)

    @classmethod
    def heappush(cls, heap, entry):
        cls._heapq.heappush(heap, cls._flip(entry))

    @classmethod
    def heappop(cls, heap):
        return cls._flip(cls._heapq.heappop(heap))


class LeftmostMergeBPE(BPE):
    """Merges applied in the wrong order: the leftmost pair that has a merge, not the
    one of the lowest rank."""

    def apply_merges(self, ids):
        while True:
            pairs = [p for p in pairwise(ids) if p in self.ranks]
            if not pairs:
                return ids
            ids = merge(ids, pairs[0], self.ranks[pairs[0]][1])


def test_mutant_wrong_tie_break_fails(monkeypatch):
    monkeypatch.setattr(smol.bpe, "heapq", ReversedTies)
    texts = split_plays("val")
    ours = train(texts, 1000, [EOT])
    assert ours.merges != tokenizers_train(texts, 1000, [EOT])[1]
    assert train("xy ab", 256 + 3).merges[0] == ("Ġ", "a")  # the largest pair of ids


def test_mutant_missing_digit_split_fails(bpe, real, monkeypatch):
    monkeypatch.setattr(smol.bpe, "DIGIT", regex.compile(r"(?!)"))  # matches nothing
    unsplit = BPE(bpe.vocab, bpe.merges, bpe.special)
    assert "a  1" in mismatches(unsplit, real)


def test_mutant_merges_in_the_wrong_order_fails(bpe, real):
    leftmost = LeftmostMergeBPE(bpe.vocab, bpe.merges, bpe.special)
    assert len(mismatches(leftmost, real)) > 10
