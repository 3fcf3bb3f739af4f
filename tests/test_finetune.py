"""Supervised fine-tuning: the loss on the assistant's tokens only, padded batches, the
trainer running it (full and LoRA), and the command line with its errors."""

import json
import signal
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from smol import SmolLM
from smol.commands.finetune import main
from smol.finetune import SFTTrainer, read_conversations
from smol.lora import apply_lora, lora_layers
from smol.sft import ConversationBatches, check_messages, collate, encode_conversation
from smol.train import TrainConfig
from tests import tuning_runs as tuning
from tests.tiny_models import with_real_vocab

TINY = with_real_vocab()


def chat(question, answer, system=None):
    head = [{"role": "system", "content": system}] if system else []
    return head + [
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer},
    ]


CONVERSATIONS = [
    chat(f"What is {a} + {b}?", str(a + b), "Answer with the number only.")
    for a, b in [(2, 3), (10, 7), (41, 1), (5, 5), (13, 29), (8, 0)]
]


def test_only_the_assistants_tokens_are_targets(tokenizer):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And 2 + 2?"},
        {"role": "assistant", "content": "4"},
    ]
    ids, labels = encode_conversation(tokenizer, messages)
    assert ids == tokenizer.encode(tokenizer.apply_chat_template(messages, False))
    kept = [i for i, label in zip(ids, labels) if label != -100]
    assert tokenizer.decode(kept) == "Hello!<|im_end|>4<|im_end|>"
    assert all(label in (-100, i) for i, label in zip(ids, labels))
    # the default system prompt, the user's turns and the headers are context only
    text = tokenizer.decode([i for i, label in zip(ids, labels) if label == -100])
    assert (
        "You are a helpful AI assistant" in text and "<|im_start|>assistant\n" in text
    )
    short, short_labels = encode_conversation(tokenizer, messages, max_len=5)
    assert short == ids[:5] and short_labels == labels[:5]


@pytest.mark.parametrize(
    "messages, message",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([{"role": "user", "content": "hi"}], "no assistant message"),
        (
            [{"role": "user"}, {"role": "assistant", "content": "x"}],
            "message 0 has no 'content'",
        ),
        ([{"role": "bot", "content": "x"}], "message 0 has role 'bot'"),
        (
            [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}],
            "must be a string",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}],
            "only the first",
        ),
        (["hi"], "message 0 must be a dict"),
        (
            [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}],
            "message 0 is the assistant's",
        ),
    ],
)
def test_malformed_conversations_are_refused(messages, message):
    with pytest.raises(ValueError, match=message):
        check_messages(messages)


def test_a_template_that_does_not_concatenate_turns_is_refused():
    """The replies are found by rendering the conversation turn by turn: a template
    whose prefix of the conversation is not a prefix of its rendering is an error,
    even where the whole conversation starts with the turn rendered alone."""

    class LastFirst:  # renders the turns in reverse order
        def apply_chat_template(self, messages, add_generation_prompt=True):
            turns = "".join(f"<{m['role']}>{m['content']}" for m in messages[::-1])
            return turns + ("<assistant>" if add_generation_prompt else "")

    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    with pytest.raises(ValueError, match="concatenation of its turns"):
        encode_conversation(LastFirst(), messages)


def test_a_value_in_an_error_is_shown_whole_up_to_80_characters():
    fits, cut = "x" * 78, "y" * 79  # reprs of 80 and 81 characters
    with pytest.raises(ValueError) as e:
        check_messages([fits])
    assert str(e.value).endswith(f"got '{fits}'")
    with pytest.raises(ValueError) as e:
        check_messages([cut])
    assert str(e.value).endswith("got '" + "y" * 76 + "...")


def test_collate_pads_right_and_shifts(tokenizer):
    examples = [encode_conversation(tokenizer, c) for c in CONVERSATIONS[:3]]
    x, y, mask = collate(examples, tokenizer.pad_token_id)
    T = max(len(ids) for ids, _ in examples) - 1
    assert x.shape == y.shape == mask.shape == (3, T)
    for b, (ids, labels) in enumerate(examples):
        n = len(ids) - 1
        assert x[b, :n].tolist() == ids[:-1] and y[b, :n].tolist() == labels[1:]
        assert mask[b, :n].all() and not mask[b, n:].any()
        assert (y[b, n:] == -100).all() and (x[b, n:] == tokenizer.pad_token_id).all()
    assert x.dtype == y.dtype == mask.dtype == torch.long  # as Hugging Face's are
    # two tokens are the shortest example: one to read, one to predict
    x, y, mask = collate([([5, 6], [-100, 6])], tokenizer.pad_token_id)
    assert (x.tolist(), y.tolist(), mask.tolist()) == ([[5]], [[6]], [[1]])
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        collate([([5], [5])], tokenizer.pad_token_id)


def test_the_loss_ignores_minus_100_and_padding(tokenizer):
    torch.manual_seed(0)
    model = SmolLM(TINY).eval()
    examples = [encode_conversation(tokenizer, c) for c in CONVERSATIONS[:4]]
    x, y, mask = collate(examples, tokenizer.pad_token_id)
    with torch.no_grad():
        logits, loss = model(x, y, mask)
        kept = y != -100
        by_hand = F.cross_entropy(logits[kept], y[kept])  # only the assistant's tokens
        torch.testing.assert_close(loss, by_hand)
        # each reply alone, unpadded, gives the same per-token losses
        total, count = 0.0, 0
        for ids, labels in examples:
            xi, yi = torch.tensor([ids[:-1]]), torch.tensor([labels[1:]])
            li, lossi = model(xi, yi)
            n = (yi != -100).sum()
            total, count = total + lossi * n, count + n
        torch.testing.assert_close(loss, total / count, atol=1e-5, rtol=1e-5)
        # right padding under causal attention: real tokens never see it, mask or not
        no_mask, _ = model(x, y)
        torch.testing.assert_close(
            no_mask[mask.bool()], logits[mask.bool()], atol=1e-5, rtol=0
        )


def test_batches_visit_every_example_each_epoch_and_resume(tokenizer):
    examples = [encode_conversation(tokenizer, c) for c in CONVERSATIONS]
    batches = ConversationBatches(examples, 2, tokenizer.pad_token_id, seed=1)
    seen = [tuple(row.tolist()) for _ in range(3) for row in next(batches)[0]]
    assert len(set(seen)) == 6
    state = batches.state_dict()
    after = next(batches)
    again = ConversationBatches(examples, 2, tokenizer.pad_token_id, seed=1)
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(next(again), after))


def test_batches_default_to_a_seeded_shuffle_and_split_ranks_without_overlap():
    examples = [([i, i + 1], [i, i + 1]) for i in range(10)]

    def firsts(batches, n=5):
        return [next(batches)[0][:, 0].tolist() for _ in range(n)]

    default = firsts(ConversationBatches(examples, 2, 0))
    named = ConversationBatches(examples, 2, 0, seed=0, shuffle=True, rank=0)
    assert default == firsts(named)
    assert default != firsts(ConversationBatches(examples, 2, 0, seed=1))
    in_order = firsts(ConversationBatches(examples, 1, 0, shuffle=False), 12)
    assert in_order == [[i % 10] for i in range(12)]
    # two ranks take the next 2 * batch_size examples between them, in turn
    ranks = [
        firsts(ConversationBatches(examples, 2, 0, shuffle=False, rank=r, world_size=2))
        for r in (0, 1)
    ]
    assert ranks[0][:3] == [[0, 1], [4, 5], [8, 9]]
    assert ranks[1][:3] == [[2, 3], [6, 7], [0, 1]]


def _trainer(tokenizer, tmp_path, lora, steps=12, lr=3e-3, resume=False):
    torch.manual_seed(0)
    model = SmolLM(TINY)
    if lora:
        apply_lora(model, 4, 8.0, ("q_proj", "v_proj", "down_proj"))
    cfg = TrainConfig(
        steps=steps,
        batch_size=3,
        seq_len=64,
        lr=lr,
        min_lr=lr,
        warmup_steps=1,
        weight_decay=0.0,
        eval_every=steps,
        eval_batches=2,
        device="cpu",
        out_dir=str(tmp_path),
        progress=False,
        resume=resume,
    )
    return SFTTrainer(cfg, model, tokenizer, CONVERSATIONS, CONVERSATIONS[:2])


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_trainer_fine_tunes_on_the_replies(tokenizer, tmp_path, lora):
    trainer = _trainer(tokenizer, tmp_path, lora, lr=3e-2 if lora else 3e-3)
    frozen = {
        n: p.detach().clone()
        for n, p in trainer.model.named_parameters()
        if not p.requires_grad
    }
    before = trainer.evaluate()
    history = trainer.fit()
    assert history["val_loss"][-1] < before - 0.5, (before, history["val_loss"])
    for name, p in trainer.model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), f"{name} is frozen and changed"
    if lora:
        assert frozen and all(
            layer.lora_B.abs().sum() > 0
            for layer in lora_layers(trainer.model).values()
        )
    else:
        assert not frozen
    # the checkpoint resumes
    resumed = _trainer(
        tokenizer, tmp_path, lora, lr=3e-2 if lora else 3e-3, resume=True
    )
    assert resumed.step == trainer.step
    assert resumed.train_batches.position == trainer.train_batches.position


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "line 2: not valid JSON"),
        ('["messages"]', 'line 2: expected an object {"messages": [...]}'),
        ({"conversation": []}, 'line 2: expected an object {"messages": [...]}'),
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            "line 2: the conversation has no assistant",
        ),
        (
            {"messages": [{"role": "robot", "content": "hi"}]},
            "line 2: message 0 has role 'robot'",
        ),
    ],
)
def test_malformed_lines_name_their_line_and_fault(tmp_path, bad, message):
    path = tuning.write_jsonl(
        tmp_path / "data.jsonl", [{"messages": CONVERSATIONS[0]}, bad]
    )
    with pytest.raises(ValueError) as info:
        read_conversations(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_blank_lines_are_skipped_and_empty_files_refused(tmp_path):
    path = tuning.write_jsonl(
        tmp_path / "ok.jsonl", [{"messages": c} for c in CONVERSATIONS[:2]] + [""]
    )
    assert read_conversations(path) == CONVERSATIONS[:2]
    with pytest.raises(ValueError, match="holds no conversations"):
        read_conversations(tuning.write_jsonl(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_conversations(tmp_path / "missing.jsonl")


def test_command_line_writes_a_merged_model_that_transformers_loads(
    tokenizer, tmp_path, capsys
):
    from transformers import AutoModelForCausalLM

    from smol.pretrained import load_pretrained, save_pretrained

    torch.manual_seed(0)
    save_pretrained(SmolLM(TINY), tokenizer, tmp_path / "base")
    data = tuning.write_jsonl(
        tmp_path / "train.jsonl", [{"messages": c} for c in CONVERSATIONS]
    )
    out = tmp_path / "out"
    code = main(
        [
            "--data",
            str(data),
            "--val-data",
            str(data),
            "--model",
            str(tmp_path / "base"),
            "--lora-r",
            "2",
            "--lora-targets",
            "q_proj,v_proj",
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--max-len",
            "64",
            "--eval-every",
            "3",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "LoRA r=2" in printed and "the merged model is in" in printed
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 2
    model, tok = load_pretrained(out, device="cpu")
    assert not lora_layers(model) and tok.chat_template == tokenizer.chat_template
    ids = torch.tensor([tokenizer.encode("What is 2 + 2?")])
    ref = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(ref(ids).logits, model(ids)[0], atol=1e-5, rtol=0)


def test_command_line_reports_a_bad_line_and_exits_1(tmp_path, capsys):
    data = tuning.write_jsonl(
        tmp_path / "bad.jsonl", [{"messages": CONVERSATIONS[0]}, "{oops"]
    )
    assert main(["--data", str(data), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "line 2: not valid JSON" in err


def test_a_line_that_is_not_utf8_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps({"messages": CONVERSATIONS[0]}).encode()
    path.write_bytes(good + b"\n" + good.replace(b"What", b"Qu\xe9") + b"\n")
    with pytest.raises(ValueError, match=r"latin1.jsonl, line 2: not UTF-8 text"):
        read_conversations(path)
    path.write_bytes(b"\xef\xbb\xbf" + good + b"\n")  # a byte order mark is fine
    assert read_conversations(path) == CONVERSATIONS[:1]


# --- the command line at the trainer's standard ------------------------------------


@pytest.fixture(scope="module")
def base(tokenizer, tmp_path_factory):
    """A tiny model folder with SmolLM2's tokenizer and a context of 2048 (more than
    the tiny preset's 512), and the conversations as JSONL."""
    rows = [{"messages": c} for c in CONVERSATIONS]
    return tuning.make_base(
        tmp_path_factory.mktemp("base"), tokenizer, "data.jsonl", rows
    )


def finetune(base, out, *options, capsys=None):
    """main() on the base model and data: (exit status, stdout, stderr)."""
    return tuning.run_main(
        main, base / "data.jsonl", base / "model", out, options, capsys
    )


def test_the_same_seed_gives_the_same_adapter_bit_for_bit(base, tmp_path, capsys):
    """The LoRA matrices are drawn after seeding: two runs in one process (whose
    random state has moved on in between) give the same adapter, another seed
    another one."""
    runs = {}
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        code, _, err = finetune(base, tmp_path / name, "--seed", seed, capsys=capsys)
        assert code == 0, err
        runs[name] = tuning.adapter_of(tmp_path / name)
    assert runs["a"].keys() == runs["b"].keys()
    assert all(torch.equal(runs["a"][k], runs["b"][k]) for k in runs["a"])
    assert not all(torch.equal(runs["a"][k], runs["c"][k]) for k in runs["a"])


def test_max_len_is_checked_against_the_loaded_models_context(base, tmp_path, capsys):
    code, out, err = finetune(base, tmp_path / "a", "--max-len", "1024", capsys=capsys)
    assert code == 0, err  # more than the tiny preset's 512: the model holds 2048
    code, out, err = finetune(base, tmp_path / "b", "--max-len", "4096", capsys=capsys)
    assert code == 1 and err.count("\n") == 1
    assert "--max-len 4096 is longer than the model's context of 2048 tokens" in err


@pytest.mark.parametrize(
    "options, says",
    [
        (
            ["--lora-r", "0", "--lora-targets", "q_proj", "--lora-dropout", "0.1"],
            "--lora-dropout, --lora-targets set LoRA",
        ),
        (["--lora-alpha", "nan"], "alpha must be a positive finite number, got nan"),
        (["--lora-targets", "q_proj,qproj"], r"unknown LoRA targets \['qproj'\]"),
        (["--lora-r", "-1"], "--lora-r must be >= 0"),
        (["--out", ""], "--out is empty"),
        (["--out", "{model}"], "is the model being fine-tuned"),
        (["--data", ""], "--data is empty: name a JSONL file"),
        (["--lora-targets", ""], "--lora-targets '' holds an empty name: give"),
        (["--lora-targets", "q_proj,,v_proj"], "'q_proj,,v_proj' holds an empty name"),
        (["--val-data", " "], "--val-data is empty: name a JSONL file"),
        *tuning.USAGE_ERRORS,
    ],
)
def test_usage_errors_exit_2_before_any_work(base, capsys, monkeypatch, options, says):
    out = base / "unused"
    options = [o.format(model=base / "model") for o in options]
    run = partial(finetune, base, capsys=capsys)
    tuning.check_usage_error("finetune", run, out, options, says, monkeypatch)


def test_an_earlier_fine_tune_is_not_written_over_unasked(base, tmp_path, capsys):
    out, run = tmp_path / "out", partial(finetune, base, capsys=capsys)
    tuning.check_an_earlier_run_is_kept(run, out)
    # a model folder that no fine-tune wrote is not written over either
    from smol.pretrained import save_pretrained

    other = save_pretrained(SmolLM(TINY), None, tmp_path / "other")
    before_other = {p: p.read_bytes() for p in other.iterdir()}
    code, _, err = run(other)
    assert code == 2 and "already holds a fine-tune (config.json" in err
    assert {p: p.read_bytes() for p in other.iterdir()} == before_other
    tuning.check_overwrite_starts_over(run, out)


def test_conversations_left_out_for_length_are_counted_and_named(
    base, tmp_path, capsys
):
    long = chat("Tell me a story. " * 30, "Once upon a time.")  # the reply past 64
    data = tuning.write_jsonl(
        tmp_path / "data.jsonl",
        [{"messages": c} for c in CONVERSATIONS[:2]] + ["", {"messages": long}],
    )
    code, out, err = finetune(
        base, tmp_path / "out", "--data", str(data), capsys=capsys
    )
    assert code == 0, err
    assert (
        f"warning: 1 of 3 training conversations have no reply within --max-len 64 "
        f"tokens and are left out: {data}, lines 4"
    ) in err
    assert out.startswith("2 training conversations")


def test_a_failure_to_write_is_one_line(base, tmp_path, capsys, monkeypatch):
    """safetensors reports a full disk with its own error class, not an OSError."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    code, _, err = finetune(base, tmp_path / "out", capsys=capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "error: cannot write" in err and "No space left on device" in err


def test_a_resume_refuses_other_lora_settings_or_data(base, tmp_path, capsys):
    out = tmp_path / "out"
    assert finetune(base, out, capsys=capsys)[0] == 0
    code, _, err = finetune(base, out, "--resume", "--lora-r", "4", capsys=capsys)
    assert code == 1 and "lora_r: the run's 2, now 4" in err
    assert "--allow-changed-settings" in err


# SIGTERM or Ctrl-C: a checkpoint, one line saying where, status 143 or 130; --resume
# continues the run

SIGNAL_OPTIONS = (
    "--lora-r 2 --steps 30 --batch-size 2 --max-len 64 --eval-every 0 --device cpu "
    "--no-progress --log-every 5"
).split()


def run_finetune(base, out, *extra, signal_at=None, sig=signal.SIGTERM):
    """`smol finetune` in a subprocess; with signal_at, send `sig` once the
    checkpoint of that step exists."""
    data, model = base / "data.jsonl", base / "model"
    return tuning.run_in_subprocess(
        "finetune", data, model, SIGNAL_OPTIONS, out, extra, signal_at, sig
    )


@pytest.fixture(scope="module")
def uninterrupted(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    code, _, err = run_finetune(base, out)
    assert code == 0, err
    return tuning.adapter_of(out)


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_and_the_resume_gives_the_uninterrupted_adapter(
    base, uninterrupted, tmp_path, sig, status
):
    run = partial(run_finetune, base, sig=sig)
    tuning.check_a_stop_resumes_to(
        uninterrupted, run, tmp_path / "stopped", sig, status
    )
