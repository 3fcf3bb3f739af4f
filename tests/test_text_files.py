"""Every text file smol reads or writes is UTF-8, whatever the machine's locale.

Without an explicit encoding Python uses the locale's: cp1252 on most Windows machines,
ASCII under a bare POSIX locale. A chat template, a run id or an adapter's settings
with a character outside it would then fail to save, or be read back as other text."""

import ast
import io
import json
from pathlib import Path

import pytest
import torch

import smol
from smol import SmolConfig, SmolLM, checkpoint

PACKAGE = Path(smol.__file__).parent
TEXT_CALLS = {"read_text", "write_text"}


def calls_without_encoding(path: Path) -> list[str]:
    """`open(...)` in a text mode, `.read_text(...)` and `.write_text(...)` calls in
    path that name no encoding, as "file:line"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        keywords = {k.arg for k in node.keywords}
        if isinstance(func, ast.Attribute) and func.attr in TEXT_CALLS:
            text = True
        elif isinstance(func, ast.Name) and func.id == "open":
            mode = node.args[1] if len(node.args) > 1 else None
            mode = next((k.value for k in node.keywords if k.arg == "mode"), mode)
            text = not (isinstance(mode, ast.Constant) and "b" in str(mode.value))
        else:
            continue
        if text and "encoding" not in keywords:
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_every_text_file_smol_opens_names_its_encoding(tmp_path):
    missing = [
        c for p in sorted(PACKAGE.glob("*.py")) for c in calls_without_encoding(p)
    ]
    assert missing == [], f"text I/O in the locale's encoding: {missing}"
    # the check itself: each kind of call without an encoding is found
    sample = tmp_path / "sample.py"
    sample.write_text(
        "open(p)\nopen(p, 'w')\nopen(p, mode='a')\nopen(p, 'rb')\n"
        "p.read_text()\np.write_text(s)\np.read_text(encoding='utf-8')\n",
        encoding="utf-8",
    )
    assert calls_without_encoding(sample) == [f"sample.py:{i}" for i in (1, 2, 3, 5, 6)]


@pytest.fixture
def ascii_locale(monkeypatch, tmp_path):
    """pathlib's text calls without an encoding take ASCII, as under a bare POSIX
    locale (Windows' cp1252 fails the same way on most of Unicode)."""
    text_encoding = io.text_encoding

    def ascii_default(encoding, stacklevel=2):
        return "ascii" if encoding is None else text_encoding(encoding, stacklevel)

    monkeypatch.setattr(io, "text_encoding", ascii_default)
    with pytest.raises(UnicodeEncodeError):  # the stand-in takes effect
        (tmp_path / "probe.txt").write_text("é")


def test_files_round_trip_under_an_ascii_locale(ascii_locale, tmp_path):
    """A checkpoint whose run id, and a tokenizer whose chat template, hold non-ASCII
    text save and load back unchanged; so does a template in chat_template.jinja (as
    transformers writes it)."""
    from smol.tokenizer import Tokenizer

    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny"))
    path = checkpoint.save(tmp_path / "ckpt", 1, model, {"step": 1}, run_id="née-1")
    assert checkpoint.read_manifest(path)["run_id"] == "née-1"
    assert checkpoint.load(path)[1]["run_id"] == "née-1"

    template = "{% for m in messages %}« {{ m['content'] }} »{% endfor %}"
    tok = Tokenizer.from_gguf_fields(
        ["<s>", "</s>", "a", "b", "ab"], ["a b"], [3, 3, 1, 1, 1], bos_id=0, eos_id=1
    )
    tok.chat_template = template
    tok.save(tmp_path / "tok")
    assert Tokenizer.from_folder(tmp_path / "tok").chat_template == template
    config = checkpoint.read_json(tmp_path / "tok" / "tokenizer_config.json")
    del config["chat_template"]
    (tmp_path / "tok" / "tokenizer_config.json").write_text(
        json.dumps(config), encoding="utf-8"
    )
    (tmp_path / "tok" / "chat_template.jinja").write_text(template, encoding="utf-8")
    assert Tokenizer.from_folder(tmp_path / "tok").chat_template == template
