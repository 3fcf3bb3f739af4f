"""`smol generate|chat`: every bad input gives one clear line and exit status
2 (a bad command line) or 1 (anything else); the fast options and the interactive chat
work."""

import io
import re
import subprocess
import sys

import pytest
import torch

import smol.pretrained
from smol import prepack, speculative
from smol.commands import main
from smol.commands.generate import speed_report
from smol.chat import ChatSession
from smol.gguf import bundled_gguf_path

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def fake_load(real_model, monkeypatch):
    """load_pretrained answers with the session's real model, reading no file."""
    calls = []

    def load(source, device, dtype):
        calls.append((source, device, dtype))
        if dtype != torch.float32:
            import copy

            return copy.deepcopy(real_model[0]).to(dtype), real_model[1]
        return real_model

    monkeypatch.setattr(smol.pretrained, "load_pretrained", load)
    return calls


INT4_DRAFT = ["generate", "Hi", "--speculative", "4", "--draft", "int4"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", ""], "the prompt is empty"),
        (["chat", "   "], "the message is empty"),
        (["generate", "Hi", "--top-p", "1.5"], "--top-p must lie in (0, 1]"),
        (["generate", "Hi", "--top-p", "0"], "--top-p must lie in (0, 1]"),
        (["generate", "Hi", "--top-k", "0"], "--top-k must be >= 1"),
        (["generate", "Hi", "--temperature", "-1"], "--temperature must be"),
        (["generate", "Hi", "--temperature", "nan"], "--temperature must be"),
        (["generate", "Hi", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["generate", "Hi", "--speculative", "4", "--temperature", "0.7"], "greedily"),
        (["generate", "Hi", "--speculative", "4", "--compile"], "do not combine"),
        (
            ["generate", "Hi", "--quantize", "int8", "--dtype", "float16"],
            "--quantize int8 takes",
        ),
        (["generate", "Hi", "--device", "tpu"], "--device must be cpu, cuda"),
        (["chat", "--speculative", "4"], "not the interactive chat"),
        (["generate", "Hi", "--draft", "bfloat16"], "--draft drafts for --speculative"),
        (
            [
                "generate",
                "Hi",
                "--speculative",
                "4",
                "--draft",
                "bfloat16",
                "--quantize",
                "int8",
            ],
            "leave out --dtype and --quantize",
        ),
        (
            [
                "chat",
                "Hi",
                "--speculative",
                "4",
                "--draft",
                "bfloat16",
                "--dtype",
                "bfloat16",
            ],
            "leave out --dtype and --quantize",
        ),
        (
            [*INT4_DRAFT, "--source", "d"],
            "give a .gguf --source (or none: the bundled file), got d",
        ),
        ([*INT4_DRAFT, "--device", "cuda"], "--draft int4 runs on the CPU only"),
        (["chat", "--compile"], "--compile works for one message, not the interactive"),
        (["generate", "Hi", "--threads", "0"], "--threads must be in [1, 1024], got 0"),
        (["chat", "Hi", "--threads", "-2"], "--threads must be in [1, 1024], got -2"),
        # torch.set_num_threads overflows past 2**31, and crashes at some 10**5
        (["generate", "Hi", "--threads", str(2**70)], "--threads must be in [1, 1024]"),
        (["generate", "   "], "the prompt is empty"),
        # bytes that are not UTF-8 reach Python as lone surrogates
        (["generate", "caf\udce9"], "the prompt is not UTF-8 text: 'caf\\udce9'"),
        (["chat", "caf\udce9"], "the message is not UTF-8 text"),
        (["chat", "Hi", "--system", "caf\udce9"], "--system is not UTF-8 text"),
        (
            ["generate", "Hi", "--temperature", "1e-320"],
            "--temperature must be 0 (greedy) or at least 1e-06, got 1e-320",
        ),
        (
            ["generate", "Hi", "--seed", str(2**64)],
            f"--seed must lie in [0, 2**64 - 1], got {2**64}",
        ),
        (["chat", "Hi", "--seed", "-1"], "--seed must lie in [0, 2**64 - 1], got -1"),
        (["generate", "Hi", "--source", ""], "--source is empty"),
        (["chat", "Hi", "--system", " "], "--system is empty"),
        (
            ["grpo", "--task", "add", "--temperature", "1e-320"],
            "--temperature must be at least 1e-06, got 1e-320",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(
        smol.pretrained,
        "load_pretrained",
        lambda *a, **k: pytest.fail("nothing is loaded for a bad command line"),
    )
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("smol ")


@pytest.mark.parametrize(
    "argv",
    [
        ["generate"],
        ["generate", "Hi", "--top-k", "x"],
        ["chat", "Hi", "--quantize", "int4"],
        ["speak", "Hi"],
    ],
)
def test_argparse_errors_are_one_line_too(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "error:" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_exits_1(capsys):
    code, out, err = run(["generate", "Hi", "--device", "cuda"], capsys)
    assert code == 1 and err.count("\n") == 1 and "no CUDA device" in err


def test_bad_sources_exit_1_with_one_line(tmp_path, capsys, real_model):
    text = tmp_path / "notes.gguf"
    text.write_text("just some text\n" * 10)
    real = bundled_gguf_path()
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(real.read_bytes()[:2_000_000])
    for source, message in [
        (tmp_path / "missing.gguf", "no such file"),
        (text, "is not a GGUF file"),
        (truncated, "truncated"),
    ]:
        code, out, err = run(["generate", "Hi", "--source", str(source)], capsys)
        assert code == 1 and err.count("\n") == 1 and message in err, err


def test_prompt_longer_than_the_context_exits_1(fake_load, capsys):
    code, out, err = run(["generate", "hello " * 8300, "--max-new-tokens", "4"], capsys)
    assert code == 1 and "the prompt has" in err and "context holds 8192" in err
    assert err.count("error:") == 1 and err.endswith("8192\n")  # after the status line


def test_more_new_tokens_than_the_context_holds_is_a_usage_error(fake_load, capsys):
    """A --max-new-tokens past the model's context (no prompt leaves room for them) is
    refused with status 2, not clamped into thousands of tokens of work."""
    code, out, err = run(["generate", "hi", "--max-new-tokens", str(2**70)], capsys)
    assert code == 2 and err.count("error:") == 1
    assert f"--max-new-tokens {2**70} is more than the context (8192)" in err


def test_drafts_past_the_context_are_refused_before_any_work(fake_load, capsys):
    """--speculative K keeps K drafted tokens in the cache past the last one: a K
    the context cannot hold is a usage error, and a prompt that leaves no room for
    K more a failure that says so, not the cache's complaint."""
    code, _, err = run(["generate", "hi", "--speculative", str(2**70)], capsys)
    assert code == 2 and err.count("error:") == 1
    assert f"--speculative {2**70} is not less than the context (8192)" in err
    code, _, err = run(["generate", "hello " * 8190, "--speculative", "16"], capsys)
    assert code == 1 and err.count("error:") == 1
    assert "context holds 8192 (less --speculative 16)" in err


def test_fast_options_give_the_same_text(fake_load, capsys, monkeypatch):
    base = [
        "generate",
        "The capital of France is",
        "--max-new-tokens",
        "12",
        "--device",
        "cpu",
    ]
    code, expected, err = run(base, capsys)
    assert code == 0 and "Paris" in expected
    assert "[loaded in " in err and "float32; a KV cache]" in err
    verifiers = []  # whether each speculative run checked with PackedLinears
    check = speculative.speculative_greedy

    def checked(model, *a, **kw):
        verifiers.append(isinstance(model.lm_head, prepack.PackedLinear))
        return check(model, *a, **kw)

    monkeypatch.setattr(speculative, "speculative_greedy", checked)
    code, out, err = run(base + ["--speculative", "4"], capsys)
    assert out == expected and "up to 4 tokens a step drafted by prompt lookup]" in err
    drafts = []  # the dtype and the class of each draft model given
    make = speculative.ModelDraft

    def noted(m, *a):
        drafts.append((m.model.embed_tokens.weight.dtype, type(m).__name__))
        return make(m, *a)

    monkeypatch.setattr(speculative, "ModelDraft", noted)
    code, out, err = run(base + ["--speculative", "4", "--draft", "bfloat16"], capsys)
    assert code == 0 and out == expected and "float32, bfloat16 draft" in err
    assert "drafted by a draft model]" in err
    code, out, err = run(base + ["--speculative", "4", "--draft", "int4"], capsys)
    assert code == 0 and out == expected and "float32, int4 draft" in err
    assert drafts == [(torch.bfloat16, "SmolLM"), (torch.bfloat16, "FusedInt4LM")]
    # on a CPU, float32 checks ran with weights oneDNN reordered once
    assert verifiers == [prepack.available()] * 3
    code, out, err = run(base + ["--dtype", "bfloat16"], capsys)
    assert code == 0 and out == expected and "bfloat16" in err
    code, out, err = run(base + ["--quantize", "int8"], capsys)
    assert (
        code == 0
        and "int8 weights" in err
        and out.startswith("The capital of France is")
    )


def test_interactive_chat_keeps_history_and_resets(fake_load, capsys, monkeypatch):
    monkeypatch.setattr(
        sys,
        "stdin",
        io.StringIO(
            "What is the capital of France?\n\n/help\nAnd of Germany?\n/reset\n"
            "What is the capital of France?\n/exit\nnever read\n"
        ),
    )
    code, out, err = run(["chat", "--max-new-tokens", "16"], capsys)
    assert code == 0
    replies = out.strip().split("\n")
    assert len(replies) == 3 and "Paris" in replies[0] and "Berlin" in replies[1]
    assert replies[2] == replies[0]  # after /reset the conversation starts over
    assert "unknown command /help" in err and "starts over" in err


def test_interactive_chat_with_stdin_piped_in_a_subprocess():
    """The real command, its stdin a pipe: two turns, then end of input."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "smol",
            "chat",
            "--max-new-tokens",
            "12",
            "--device",
            "cpu",
        ],
        input="What is the capital of France?\nAnd of Italy?\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().split("\n")
    assert len(lines) == 2 and "Paris" in lines[0] and "Rome" in lines[1], result.stdout


# --- the interactive chat survives its user ------------------------------------------


class Terminal(io.StringIO):
    """Lines typed at a terminal."""

    def isatty(self):
        return True


def interrupted_stream(reply: int):
    """A TextStream whose `reply`-th reply is stopped by Ctrl-C in its third token."""
    import smol.commands.chat

    class Interrupted(smol.commands.chat.TextStream):
        replies = 0

        def __call__(self, tokens):
            if len(self.ids) == 0:
                Interrupted.replies += 1
            if Interrupted.replies == reply and len(self.ids) == 2:
                raise KeyboardInterrupt
            super().__call__(tokens)

    return Interrupted


def test_ctrl_c_stops_the_reply_not_the_chat(fake_load, capsys, monkeypatch):
    """At a terminal, Ctrl-C during the first reply stops that reply; the chat reads
    the next line and answers it."""
    import smol.commands.chat

    monkeypatch.setattr(smol.commands.chat, "TextStream", interrupted_stream(1))
    monkeypatch.setattr(
        sys, "stdin", Terminal("What is the capital of France?\nAnd of Germany?\n")
    )
    code, out, err = run(["chat", "--max-new-tokens", "16"], capsys)
    assert code == 0, err
    assert "[stopped; Ctrl-C at the prompt, /exit or Ctrl-D leaves the chat]" in err
    first, second, end = out.split("\n")
    assert first.startswith("> ") and len(first) < 22, out
    assert second.startswith("> ") and "Berlin" in second and end == "> ", out


def test_ctrl_c_at_the_prompt_or_without_a_terminal_leaves_the_chat(
    fake_load, capsys, monkeypatch
):
    """Ctrl-C while the chat waits for a line ends it, 130; so does Ctrl-C during a
    reply where stdin is not a terminal (no one waits at a prompt): the lines after
    are not answered."""
    import smol.commands.chat

    class Waiting(Terminal):
        def readline(self, *args):
            raise KeyboardInterrupt

    monkeypatch.setattr(sys, "stdin", Waiting())
    code, out, err = run(["chat"], capsys)
    assert (code, out) == (130, "> ") and err.endswith("smol chat: interrupted\n")
    monkeypatch.setattr(smol.commands.chat, "TextStream", interrupted_stream(1))
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi?\nWhat is the capital?\n"))
    code, out, err = run(["chat", "--max-new-tokens", "16"], capsys)
    assert code == 130 and out.count("\n") == 1 and "Paris" not in out, out
    assert err.endswith("smol chat: interrupted\n") and "[stopped" not in err


def test_a_line_that_is_not_text_is_refused_and_the_chat_goes_on(
    fake_load, capsys, monkeypatch
):
    lines = b"caf\xe9 au lait?\nWhat is the capital of France?\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines)))
    code, out, err = run(["chat", "--max-new-tokens", "12"], capsys)
    assert code == 0, err
    assert "[that line is not UTF-8 text (invalid continuation byte): left out]" in err
    assert out.strip().count("\n") == 0 and "Paris" in out


def _tiny_chat_model(real_model):
    from tests.tiny_models import peaked, with_real_vocab

    return peaked(with_real_vocab(max_position_embeddings=128)), real_model[1]


def test_a_conversation_that_outgrows_the_context_drops_its_oldest_turns(real_model):
    """A context of 128 tokens holds two or three exchanges: later turns drop the
    oldest (with a notice), keep the system prompt, and answer as a session that
    re-reads the conversation from scratch each turn."""
    model, tokenizer = _tiny_chat_model(real_model)
    notices = []
    kept = ChatSession(model, tokenizer, system="Be brief.", notice=notices.append)
    fresh = ChatSession(model, tokenizer, system="Be brief.", reuse_cache=False)
    for i in range(6):
        text = f"Question number {i}: what comes next?"
        assert kept.send(text, 16, temperature=0) == fresh.send(text, 16, temperature=0)
        shown = tokenizer.apply_chat_template(
            kept.messages, add_generation_prompt=False
        )
        assert len(tokenizer.encode(shown)) <= 128
    assert kept.messages == fresh.messages
    assert kept.messages[0] == {"role": "system", "content": "Be brief."}
    assert kept.messages[1]["content"] != "Question number 0: what comes next?"
    assert kept.messages[-2]["content"] == "Question number 5: what comes next?"
    assert notices and "outgrew the context of 128 tokens" in notices[0]
    with pytest.raises(ValueError, match="more than the model's context of 128"):
        kept.send("word " * 200, 16)
    with pytest.raises(ValueError, match="not valid text"):
        kept.send("caf\udce9", 16)
    assert kept.messages == fresh.messages  # refused messages change nothing


def test_a_reply_stopped_midway_stays_as_far_as_it_got(real_model):
    model, tokenizer = _tiny_chat_model(real_model)

    def stop_at(n):
        seen = []

        def stream(tokens):
            seen.append(tokens)
            if len(seen) == n:
                raise KeyboardInterrupt

        return stream

    sessions = (
        ChatSession(model, tokenizer),
        ChatSession(model, tokenizer, reuse_cache=False),
    )
    for session in sessions:
        session.send("Hello there", 8, temperature=0)
        with pytest.raises(KeyboardInterrupt):
            session.send("Tell me more", 16, stream=stop_at(3), temperature=0)
    kept, fresh = sessions
    assert kept.messages == fresh.messages and kept.messages[-2:][0] == {
        "role": "user",
        "content": "Tell me more",
    }
    partial = tokenizer.encode(kept.messages[-1]["content"])
    assert 1 <= len(partial) <= 3
    # the cache holds what the conversation says: the next turn agrees with a re-read
    assert kept.send("Go on", 8, temperature=0) == fresh.send("Go on", 8, temperature=0)


def test_speed_report_counts_tokens_and_the_median_step():
    """Generation began at 10.0 s; the first token came at 10.5 s, the second a second
    later (a step that compiles, say), then three more 0.25 s apart."""
    line = speed_report(1.3, 10.0, [10.5, 11.5, 11.75, 12.0, 12.25])
    assert line.startswith(
        "[5 new tokens in 2.2 s: 2.2 tokens/s, 4.0 at the median step, the first "
        "after 0.50 s; loaded in 1.3 s; "
    )
    assert speed_report(0.5, 2.0, [3.0]).startswith(
        "[1 new token in 1.0 s: 1.0 tokens/s, the first after 1.00 s; loaded in 0.5 s"
    )


def test_generate_reports_speed_on_stderr_with_the_threads_it_used(
    fake_load, real_model, capsys, monkeypatch
):
    """stdout holds the prompt and its continuation alone (a pipe gets the text); one
    line on stderr says how fast it went, on --threads threads."""
    from smol import generate as generation

    model, tokenizer = real_model
    prompt = "The capital of France is"
    ids = torch.tensor([tokenizer.encode(prompt)])
    eos = tokenizer.eos_token_id
    new = generation.generate(model, ids, 6, temperature=0.0, eos_token_id=eos)
    new = new[0, ids.shape[1] :].tolist()
    threads = []  # how many threads PyTorch had when generation began
    make = generation.generate
    monkeypatch.setattr(
        generation,
        "generate",
        lambda *a, **k: threads.append(torch.get_num_threads()) or make(*a, **k),
    )
    before = torch.get_num_threads()
    try:
        code, out, err = run(
            ["generate", prompt, "--max-new-tokens", "6", "--device", "cpu"]
            + ["--threads", str(before + 1)],
            capsys,
        )
    finally:
        torch.set_num_threads(before)
    assert code == 0 and threads == [before + 1]
    assert out == prompt + tokenizer.decode(new, skip_special_tokens=False) + "\n"
    last = err.splitlines()[-1]
    assert re.fullmatch(
        rf"\[{len(new)} new tokens in [\d.]+ s: [\d.]+ tokens/s, [\d.]+ at the median "
        rf"step, the first after [\d.]+ s; loaded in [\d.]+ s; {before + 1} threads\]",
        last,
    ), err
