"""smol's tokenizer gives transformers' ids, text and chat prompts for the bundled
SmolLM2 GGUF."""

import json

import pytest
from transformers import AutoTokenizer

from smol.gguf import GGUFFile, bundled_gguf_path, tokenizer_from_gguf
from smol.tokenizer import Tokenizer

TRICKY = [
    "Hello world",
    "",
    " ",
    "  two  spaces   and\ttabs\t",
    " leading space",
    "trailing space ",
    "line1\nline2\n\n\nline5\r\n",
    "naïve café — 東京 Ελληνικά Привет مرحبا",
    "emoji 🤗🚀 family 👩‍👩‍👧 flag 🇫🇷",
    "digits 1234567890 3.14159 1,000,000 2024-11-30 0x1F",
    "I'm you're they'll we've WE'VE",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|><jupyter_code>x=1<jupyter_output>",
    "<|im_start|",
    "def f(x):\n    return x ** 2  # comment\n",
    "CamelCaseWords and snake_case_words",
    "ÿþ\x00\x07 control",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "2+2?"},
    ],
]


@pytest.fixture(scope="module")
def tokenizers():
    path = bundled_gguf_path()
    return tokenizer_from_gguf(GGUFFile(path)), AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name
    )


@pytest.mark.parametrize("text", TRICKY)
def test_ids_and_text_equal_transformers(tokenizers, text):
    ours, ref = tokenizers
    ids = ours.encode(text)
    assert ids == ref.encode(text) == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == ref.decode(ids) == text
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(
        ids, skip_special_tokens=True
    )


def test_special_tokens(tokenizers):
    ours, ref = tokenizers
    assert (ours.bos_token, ours.bos_token_id, ours.eos_token, ours.eos_token_id) == (
        "<|im_start|>",
        1,
        "<|im_end|>",
        2,
    )
    assert (ours.bos_token, ours.eos_token, ours.pad_token) == (
        ref.bos_token,
        ref.eos_token,
        ref.pad_token,
    )
    assert ours.vocab_size == len(ref) == 49152
    # whole, and no automatic BOS in front of text
    assert ours.encode("<|im_start|>") == [1]
    assert ours.encode("Hi")[0] != 1
    assert ours.decode([1, 2], skip_special_tokens=True) == ""


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CHATS)
def test_chat_template_equals_transformers(tokenizers, messages, add_generation_prompt):
    ours, ref = tokenizers
    text = ours.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt
    )
    assert text == ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.apply_chat_template(
        messages, add_generation_prompt, tokenize=True
    ) == ours.encode(text)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_batch_encode_left_pads(tokenizers):
    ours, _ = tokenizers
    ids, mask = ours.batch_encode(["Hi", "A longer prompt here"])
    assert ids.shape == mask.shape and mask[0].tolist()[:2] == [0, 0] and mask[1].all()
    assert ids[0, mask[0].bool()].tolist() == ours.encode("Hi")
    assert ids[0, 0].item() == ours.pad_token_id


def test_save_and_read_back(tokenizers, tmp_path):
    ours, _ = tokenizers
    ours.save(tmp_path)
    again = Tokenizer.from_folder(tmp_path)
    assert (again.bos_token, again.eos_token, again.pad_token, again.chat_template) == (
        ours.bos_token,
        ours.eos_token,
        ours.pad_token,
        ours.chat_template,
    )
    for text in TRICKY:
        assert again.encode(text) == ours.encode(text)


def test_no_chat_template_is_a_clear_error(tokenizers):
    ours, _ = tokenizers
    plain = Tokenizer(ours.backend)
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template(CHATS[0])
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_folder("/nonexistent")


def test_special_tokens_are_named_by_id_and_read_back_from_a_folder(tmp_path):
    """from_gguf_fields names each special token by its id (none where no id is given);
    from_folder reads the names back, a token written as {"content": ...} too, and
    falls back to SmolLM2's where the config names none."""
    tok = Tokenizer.from_gguf_fields(
        ["<s>", "</s>", "a", "b", "ab"], ["a b"], [3, 3, 1, 1, 1], bos_id=0, eos_id=1
    )
    names = ("bos_token", "eos_token", "pad_token", "unk_token")
    assert [getattr(tok, n) for n in names] == ["<s>", "</s>", "</s>", None]
    assert tok.encode("<s>ab") == [0, 4]
    tok.save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert [config[n] for n in names] == ["<s>", "</s>", "</s>", None]
    del config["bos_token"]
    config["unk_token"] = {"content": "a", "special": False}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    again = Tokenizer.from_folder(tmp_path)
    assert [getattr(again, n) for n in names] == ["<|im_start|>", "</s>", "</s>", "a"]


@pytest.mark.parametrize(
    "call, error, says",
    [
        (lambda t: t.encode(5), TypeError, "expected text as str, got int"),
        (lambda t: t.encode(b"hi"), TypeError, "expected text as str, got bytes"),
        # tokenizers would truncate 1.5, and skip an unknown id without a word
        (lambda t: t.decode([1.5]), ValueError, r"in \[0, 49152\), got 1.5"),
        (lambda t: t.decode([19556, 49152]), ValueError, "got 49152"),
        (lambda t: t.decode([-1]), ValueError, "got -1"),
        (lambda t: t.decode("19556"), TypeError, "got the str '19556'"),
        (lambda t: t.batch_encode("hi"), TypeError, "a list of str, got the str 'hi'"),
        (lambda t: t.apply_chat_template("hi"), ValueError, "a list of dicts, got str"),
        (
            lambda t: t.apply_chat_template([{"role": "user"}]),
            ValueError,
            "message 0 must be a dict",
        ),
        (
            lambda t: t.apply_chat_template([{"role": "user", "content": 5}]),
            ValueError,
            "message 0 must be a dict",
        ),
    ],
)
def test_bad_arguments_are_named(tokenizers, call, error, says):
    with pytest.raises(error, match=says):
        call(tokenizers[0])


def test_a_template_that_raises_is_a_value_error(tokenizers):
    strict = Tokenizer(
        tokenizers[0].backend, "{{ raise_exception('roles must alternate') }}"
    )
    with pytest.raises(ValueError, match="refused the messages: roles must alternate"):
        strict.apply_chat_template(CHATS[0])
