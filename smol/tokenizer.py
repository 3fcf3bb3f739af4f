"""SmolLM2's tokenizer: byte-level BPE (with `tokenizers`) and its ChatML chat template
(with jinja2)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from tokenizers import (
    AddedToken,
    Tokenizer as Backend,
    decoders,
    models,
    pre_tokenizers,
    processors,
)

from smol.checkpoint import read_json
from smol.generate import left_pad

BOS_TOKEN, EOS_TOKEN = "<|im_start|>", "<|im_end|>"
# separates documents in a training stream; id 0 in SmolLM2's vocabulary
EOT_TOKEN = "<|endoftext|>"
GGUF_CONTROL = 3  # tokenizer.ggml.token_type of special (control) tokens
# The special tokens a Tokenizer names, and what a folder's config falls back to
SPECIAL_TOKENS = {
    "bos_token": BOS_TOKEN,
    "eos_token": EOS_TOKEN,
    "pad_token": None,
    "unk_token": None,
}


class Tokenizer:
    """Text <-> token ids around a `tokenizers.Tokenizer`, with SmolLM2's special tokens
    and chat template.

    No BOS is added automatically (SmolLM2 was trained without one); decode keeps
    special tokens by default, as transformers does. The same class wraps the small BPE
    that smol.data trains on."""

    def __init__(
        self,
        backend: Backend,
        chat_template: str | None = None,
        bos_token: str | None = BOS_TOKEN,
        eos_token: str | None = EOS_TOKEN,
        pad_token: str | None = None,
        unk_token: str | None = None,
        model_max_length: int | None = None,
    ):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token, self.eos_token, self.unk_token = bos_token, eos_token, unk_token
        self.pad_token = pad_token if pad_token is not None else eos_token
        self.model_max_length = model_max_length

    # --- building ---------------------------------------------------------------------
    @classmethod
    def from_gguf_fields(
        cls,
        tokens: list[str],
        merges: list[str],
        token_types: list[int] | None = None,
        *,
        chat_template: str | None = None,
        pre: str | None = None,
        model_max_length: int | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        unk_id: int | None = None,
    ) -> Tokenizer:
        """Rebuild the byte-level BPE from a GGUF file's vocabulary, merges and token
        types. bos_id, eos_id, pad_id and unk_id are the ids of those special tokens
        (None: the tokenizer has none)."""
        given = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id, "unk_id": unk_id}
        ids = {k: given[k.replace("_token", "_id")] for k in SPECIAL_TOKENS}
        vocab = {token: i for i, token in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        backend = Backend(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
        # SmolLM2 ("smollm" in llama.cpp) isolates every digit before GPT-2's split
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.pre_tokenizer = (
            pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
            if pre == "smollm"
            else byte_level
        )
        backend.decoder = decoders.ByteLevel()
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
        special = [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, token_types or [])
            if kind == GGUF_CONTROL
        ]
        backend.add_special_tokens(special)
        names = {key: None if i is None else tokens[i] for key, i in ids.items()}
        return cls(backend, chat_template, model_max_length=model_max_length, **names)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Tokenizer:
        """Read `tokenizer.json` (and `tokenizer_config.json` when there) from a Hugging
        Face folder."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"no tokenizer.json in {folder}: expected a Hugging Face model folder"
            )
        try:
            backend = Backend.from_file(str(path))
        except Exception as e:  # tokenizers raises a plain Exception
            raise ValueError(f"{path} is not a readable tokenizer ({e})") from None
        config_path = folder / "tokenizer_config.json"
        config = read_json(config_path) if config_path.is_file() else {}
        if not isinstance(config, dict):
            raise ValueError(f"{config_path}: expected a JSON object")

        names = {}
        for key, default in SPECIAL_TOKENS.items():
            value = config.get(key, default)
            # transformers writes a token as its text, or as {"content": text, ...}
            names[key] = value.get("content") if isinstance(value, dict) else value
        template = config.get("chat_template")
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        return cls(
            backend, template, model_max_length=config.get("model_max_length"), **names
        )

    def save(self, folder: str | Path) -> None:
        """Write tokenizer.json and a tokenizer_config.json that transformers'
        AutoTokenizer reads."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(folder / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **{key: getattr(self, key) for key in SPECIAL_TOKENS},
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": self.model_max_length,
            "chat_template": self.chat_template,
        }
        (folder / "tokenizer_config.json").write_text(
            json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )

    # --- ids --------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self.token_to_id(self.pad_token)

    @property
    def eot_id(self) -> int | None:
        """The id that separates documents (<|endoftext|>), or None when the vocabulary
        lacks it."""
        return self.token_to_id(EOT_TOKEN)

    @property
    def fingerprint(self) -> str:
        """A short hash of the whole tokenizer: token ids cached on disk are keyed by
        it."""
        return hashlib.sha256(self.backend.to_str().encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str) -> list[int]:
        """Token ids of text; special tokens written in the text (e.g. <|im_end|>)
        become their ids."""
        if not isinstance(text, str):
            raise TypeError(f"expected text as str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of token ids (ints, or a tensor or array of them)."""
        if isinstance(ids, str):
            raise TypeError(f"expected token ids, got the str {ids[:40]!r}")
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        n = self.vocab_size
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < n]
        if bad:  # tokenizers would skip an unknown id without a word
            raise ValueError(f"expected token ids in [0, {n}), got {bad[0]!r}")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def batch_encode(
        self, texts: list[str], device=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded input_ids (B, T) and attention_mask (B, T) (0 on padding), ready
        for generate."""
        if isinstance(texts, str):  # its characters would be the prompts
            raise TypeError(f"texts must be a list of str, got the str {texts[:40]!r}")
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        return left_pad([self.encode(t) for t in texts], pad, device)

    # --- chat -------------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **kwargs,
    ):
        """Render messages ([{"role": ..., "content": ...}]) with the model's own
        (ChatML) template."""
        # jinja2 only where a chat is rendered
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not self.chat_template:
            raise ValueError(
                "this tokenizer has no chat template (a base model's tokenizer?)"
            )
        check_chat(messages)

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            text = env.from_string(self.chat_template).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                pad_token=self.pad_token,
                unk_token=self.unk_token,
                **kwargs,
            )
        except TemplateError as e:
            raise ValueError(f"the chat template refused the messages: {e}") from None
        return self.encode(text) if tokenize else text

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
            f"eos={self.eos_token!r}, "
            f"chat_template={'yes' if self.chat_template else 'no'})"
        )


def check_chat(messages) -> None:
    """A ValueError unless messages is a list of {"role": str, "content": str} dicts."""
    if not isinstance(messages, list):
        raise ValueError(
            f"messages must be a list of dicts, got {type(messages).__name__}"
        )
    for i, m in enumerate(messages):
        if not (
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
        ):
            raise ValueError(
                f'message {i} must be a dict {{"role": str, "content": str}}, '
                f"got {m!r:.80}"
            )


# --- a byte-level BPE's files, read as smol.bpe.BPE's arguments ---------------------
def bpe_fields_from_gguf(meta: dict, path: Path) -> dict:
    """vocab, merges, special_tokens and split_digits of the BPE whose GGUF metadata
    (of the file at path) is meta."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(
            f"expected a byte-level BPE (tokenizer.ggml.model 'gpt2') in {path}, "
            f"got {meta.get('tokenizer.ggml.model')!r}"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in ("smollm", "gpt2", "default"):
        raise ValueError(f"expected the pre-tokenizer 'smollm' or 'gpt2', got {pre!r}")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    # "a b": byte-level tokens hold no space, so a merge line holds exactly one;
    # as in `tokenizers`, a line that is not two tokens is refused (not a pair)
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    special = [t for t, kind in zip(tokens, types) if kind == GGUF_CONTROL]
    vocab = {t: i for i, t in enumerate(tokens)}
    return dict(
        vocab=vocab, merges=merges, special_tokens=special, split_digits=pre == "smollm"
    )


def bpe_fields_from_json(spec: dict) -> dict:
    """vocab, merges, special_tokens and split_digits of the BPE of a tokenizer.json
    (as a dict)."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(
            f"expected a BPE model in tokenizer.json, got {model.get('type')!r}"
        )
    pre = spec.get("pre_tokenizer") or {}
    steps = (
        (pre.get("pretokenizers") or [pre]) if pre.get("type") == "Sequence" else [pre]
    )
    kinds = [s.get("type") for s in steps]
    digits = kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits")
    if not (kinds == ["ByteLevel"] or digits) or steps[-1].get("add_prefix_space"):
        raise ValueError(
            "expected the pre-tokenizer ByteLevel (add_prefix_space false), "
            f"optionally after Digits(individual_digits=True), got {pre}"
        )
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]
    ]
    vocab = dict(model["vocab"])
    added = spec.get("added_tokens", [])
    vocab.update({t["content"]: t["id"] for t in added})
    special = [t["content"] for t in added]
    return dict(
        vocab=vocab, merges=merges, special_tokens=special, split_digits=bool(digits)
    )
