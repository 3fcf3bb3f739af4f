"""DPO by hand (smol.dpo) equals TRL's DPOTrainer on the same batch: the tokens, the
loss, the implicit rewards, margins and accuracy, and every trainable parameter's
gradient; and the pieces each refuse the wrong implementation they are named for."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from smol import SmolLM
from smol.dpo import (
    DPOTrainer,
    adapters_off,
    check_pair,
    collate_pairs,
    dpo_loss,
    encode_pair,
    numbered_pairs,
    sequence_logprobs,
)
from smol.lora import apply_lora, lora_layers
from smol.model import IGNORE_INDEX
from smol.sft import encode_conversation
from smol.train import TrainConfig
from tests.tiny_models import same_random_lora, with_real_vocab

TINY = with_real_vocab()
TARGETS = ("q_proj", "v_proj", "down_proj")


def pair(question, chosen, rejected, system=None):
    head = [{"role": "system", "content": system}] if system else []
    return {
        "prompt": head + [{"role": "user", "content": question}],
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


PAIRS = [
    pair("What is 2 + 3?", "5", "It is 6."),
    pair("What is 10 + 7?", "17", "16", "Answer with the number only."),
    pair("Name a colour.", "Blue.", "I would rather not say anything at all."),
    pair("What is 41 + 1?", "42", "43, I think"),
]
# a conversation's later turn: the prompt holds an earlier reply, context only
FOLLOW_UP = {
    "prompt": [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "It is 5, as 2 + 3 = 5."},
        {"role": "user", "content": "And 5 + 3?"},
    ],
    "chosen": [{"role": "assistant", "content": "8"}],
    "rejected": [{"role": "assistant", "content": "It is 9, I believe."}],
}
MULTI_TURN = [*PAIRS, FOLLOW_UP]


def cpu_config(out, lr: float, **settings) -> TrainConfig:
    """A run on the CPU in float32 at the constant learning rate `lr`, into `out`: no
    preset, weight decay, evaluation or progress bar; `settings` for the rest."""
    return TrainConfig(
        preset=None,
        lr=lr,
        min_lr=lr,
        weight_decay=0.0,
        eval_every=0,
        device="cpu",
        dtype="fp32",
        out_dir=str(out),
        progress=False,
        **settings,
    )


def smol_trainer(tmp_path, model, tokenizer, pairs=PAIRS, **options):
    cfg = cpu_config(
        tmp_path / "smol",
        1e-3,
        steps=1,
        batch_size=len(pairs),
        seq_len=128,
        warmup_steps=0,
    )
    return DPOTrainer(cfg, model, tokenizer, pairs, **options)


# --- equal to TRL ------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer, tmp_path_factory):
    """transformers' tokenizer of the same files (TRL tokenizes with it)."""
    from transformers import AutoTokenizer

    from smol.pretrained import save_pretrained

    folder = tmp_path_factory.mktemp("tokenizer")
    save_pretrained(SmolLM(TINY), tokenizer, folder)
    return AutoTokenizer.from_pretrained(folder)


def _perturbed(model, seed):
    """The model with every weight moved a little: a policy unlike its reference."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.std().clamp_min(0.1))
    return model


# PAIRS as plain strings (PAIRS[1] without its system message): smol puts them in the
# chat template, with its default system prompt, as the conversational pairs of the
# same strings
PLAIN = [
    {"prompt": p["prompt"][-1]["content"]}
    | {side: p[side][0]["content"] for side in ("chosen", "rejected")}
    for p in PAIRS
]


@pytest.mark.parametrize(
    "case",
    [
        "sigmoid-reference",
        "sigmoid-lora",
        "sigmoid-saved",
        "sigmoid_norm-reference",
        "sigmoid-reference-multi_turn",
        "sigmoid_norm-reference-multi_turn",
        "sigmoid-reference-plain",
    ],
)
def test_loss_rewards_and_gradients_equal_trl(tokenizer, hf_tokenizer, tmp_path, case):
    """smol's DPO and TRL's on the same pairs: the same tokens trained, loss, rewards
    and gradient of every trained weight. "reference": full fine-tuning against a
    separate reference, TRL's models of a config without pad_token_id; "saved": the
    same, TRL's models loaded from the folders smol writes, whose pad_token_id 2 (the
    tokenizer's, <|im_end|>) makes transformers' embedding one with padding_idx 2,
    which takes no gradient from the look-ups of that row: its gradient is the one
    that differs. "plain": smol trains plain-string pairs as TRL trains the
    conversational pairs of the same strings (TRL's own plain format would train the
    strings without the chat template)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig
    from trl import DPOTrainer as TRLDPOTrainer

    from smol.pretrained import save_pretrained
    from smol.reference import llama_twin

    loss_type, how, *extra = case.split("-")
    lora, saved = how == "lora", how == "saved"
    pairs = MULTI_TURN if "multi_turn" in extra else PAIRS
    their_pairs = pairs
    if "plain" in extra:
        pairs, their_pairs = PLAIN, [pair(*p.values()) for p in PLAIN]
    beta = 0.2
    torch.manual_seed(0)
    reference = SmolLM(TINY)
    with torch.no_grad():  # norms away from one, as a trained model's are
        for name, p in reference.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    theirs = llama_twin(TINY, "sdpa")
    theirs.load_state_dict(reference.state_dict(), strict=True)
    policy = copy.deepcopy(reference)
    args = DPOConfig(
        output_dir=str(tmp_path / "trl"),
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        beta=beta,
        loss_type=[loss_type],
        max_length=None,
        per_device_train_batch_size=len(pairs),
        dataset_num_proc=None,
    )
    data = Dataset.from_list(their_pairs)
    if lora:
        apply_lora(policy, 4, 8.0, TARGETS)
        trl = TRLDPOTrainer(
            model=theirs,
            args=args,
            train_dataset=data,
            processing_class=hf_tokenizer,
            peft_config=LoraConfig(
                r=4, lora_alpha=8.0, target_modules=list(TARGETS), lora_dropout=0.0
            ),
        )
        # the same nonzero A and B on both sides: the policy is not its reference
        same_random_lora(policy, dict(trl.model.named_parameters()), seed=1)
        ours = smol_trainer(tmp_path, policy, tokenizer, pairs, beta=beta)
    else:
        _perturbed(policy, seed=1)
        theirs.load_state_dict(policy.state_dict(), strict=True)
        their_reference = llama_twin(TINY, "sdpa")
        their_reference.load_state_dict(reference.state_dict(), strict=True)
        if saved:
            for name, model in (("policy", policy), ("reference", reference)):
                save_pretrained(model, tokenizer, tmp_path / name)
            theirs, their_reference = (
                AutoModelForCausalLM.from_pretrained(tmp_path / n, dtype=torch.float32)
                for n in ("policy", "reference")
            )
            assert theirs.model.embed_tokens.padding_idx == tokenizer.pad_token_id == 2
        else:
            assert theirs.model.embed_tokens.padding_idx is None
        trl = TRLDPOTrainer(
            model=theirs,
            ref_model=their_reference,
            args=args,
            train_dataset=data,
            processing_class=hf_tokenizer,
        )
        ours = smol_trainer(
            tmp_path,
            policy,
            tokenizer,
            pairs,
            beta=beta,
            reference=reference,
            length_normalized=loss_type == "sigmoid_norm",
        )

    # the same tokens, and the same reply tokens: TRL's completion is every token after
    # the prompt rendered with its generation header, "<|im_end|>\n" included
    rows = [trl.train_dataset[i] for i in range(len(pairs))]
    for row, (chosen, rejected) in zip(
        rows, (encode_pair(tokenizer, p) for p in pairs)
    ):
        prompt = row["prompt_ids"]
        for side, (ids, labels) in (("chosen", chosen), ("rejected", rejected)):
            assert ids == prompt + row[f"{side}_ids"]
            reply = [t != IGNORE_INDEX for t in labels]
            assert reply == [False] * len(prompt) + [True] * len(row[f"{side}_ids"])
        assert hf_tokenizer.decode(row["chosen_ids"]).endswith("<|im_end|>\n")

    inputs = trl._prepare_inputs(trl.data_collator(rows))
    trl.model.train()
    their_loss = trl.compute_loss(trl.model, inputs)
    their_loss.backward()
    metrics = {k: v[-1] for k, v in trl._metrics["train"].items()}

    batch = collate_pairs([encode_pair(tokenizer, p) for p in pairs], 2)
    ours.model.train()
    out = ours.pair_loss(ours.model, batch)
    out.loss.backward()

    torch.testing.assert_close(out.loss, their_loss.detach())
    tokens = (batch[1] != IGNORE_INDEX).sum(-1).float()  # (2B,) reply tokens
    B = len(pairs)
    # TRL's sigmoid_norm logs the rewards of summed log-ratios; smol's are the
    # length-normalised ones that its loss compares
    scale = tokens if loss_type == "sigmoid_norm" else torch.ones(2 * B)
    chosen = out.chosen_rewards * scale[:B]
    rejected = out.rejected_rewards * scale[B:]
    got = {
        "rewards/chosen": chosen.mean(),
        "rewards/rejected": rejected.mean(),
        "rewards/margins": (chosen - rejected).mean(),
        "rewards/accuracies": (chosen > rejected).float().mean(),
    }
    if loss_type == "sigmoid":
        assert torch.equal(got["rewards/margins"], out.margins.mean())
        assert torch.equal(got["rewards/accuracies"], out.accuracy)
    for name, value in got.items():  # TRL's metrics are float32 values as floats
        torch.testing.assert_close(value, torch.tensor(metrics[name]), msg=name)
    assert abs(metrics["rewards/margins"]) > 1e-3  # the policy is not the reference

    named = dict(trl.model.named_parameters())
    trained = {n: p for n, p in ours.model.named_parameters() if p.requires_grad}
    assert len(trained) == sum(p.requires_grad for p in named.values())
    for name, p in trained.items():
        if lora:
            layer, part = name.rsplit(".", 1)
            name = f"base_model.model.{layer}.{part}.default.weight"
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        grad, their_grad = p.grad, named[name].grad
        if saved and name == "model.embed_tokens.weight":
            pad = tokenizer.pad_token_id  # every sequence looks its row up
            assert not torch.allclose(grad[pad], their_grad[pad])
            grad, their_grad = (
                torch.cat([g[:pad], g[pad + 1 :]]) for g in (grad, their_grad)
            )
        torch.testing.assert_close(grad, their_grad, msg=name)


# --- the pieces, each against the wrong version it is named for ---------------------


def test_the_loss_sums_the_replys_tokens_only(tokenizer):
    """sequence_logprobs counts the labelled tokens: a version summing the prompt's
    tokens too gives another number."""
    torch.manual_seed(0)
    model = SmolLM(TINY).eval()
    batch = collate_pairs([encode_pair(tokenizer, p) for p in PAIRS[:2]], 2)
    x, y, mask = batch
    with torch.no_grad():
        logits, _ = model(x, attention_mask=mask)
    got = sequence_logprobs(logits, y)
    logp = F.log_softmax(logits.float(), -1)
    by_hand = torch.stack(
        [
            sum(logp[b, t, y[b, t]] for t in range(y.shape[1]) if y[b, t] != -100)
            for b in range(y.shape[0])
        ]
    )
    torch.testing.assert_close(got, by_hand)
    # every real token scored: the prompt's tokens change the sum
    every = torch.where(mask.bool(), torch.roll(x, -1, 1), IGNORE_INDEX)
    every[:, -1] = torch.where(y[:, -1] != -100, y[:, -1], IGNORE_INDEX)
    assert (sequence_logprobs(logits, every) < got - 1).all()


def test_a_reply_scores_sfts_labels_and_the_newline_after_them(tokenizer):
    """With a prompt of one question, a reply's scored tokens are those chapter 12's
    encode_conversation labels, then the template's newline after <|im_end|>, as TRL
    scores them (chapter 15 says so): a pair labelled as SFT labels, without the
    newline, scores one token fewer."""
    question = {"role": "user", "content": "What is 17 + 25?"}
    reply = {"role": "assistant", "content": "17 + 25 = 42."}
    (_, labels), _ = encode_pair(
        tokenizer, {"prompt": [question], "chosen": "17 + 25 = 42.", "rejected": "1"}
    )
    _, sft = encode_conversation(tokenizer, [question, reply])
    scored = [t for t in labels if t != IGNORE_INDEX]
    labelled = [t for t in sft if t != IGNORE_INDEX]
    assert scored == [*labelled, *tokenizer.encode("\n")]
    assert labelled[-1] == tokenizer.eos_token_id  # <|im_end|>, SFT's last target


def test_the_reference_gets_no_gradient_and_the_margins_sign_and_beta():
    pc, pr = (
        torch.tensor([-3.0, -5.0], requires_grad=True),
        torch.tensor([-4.0, -4.0], requires_grad=True),
    )
    rc = torch.tensor([-3.5, -5.0], requires_grad=True)
    rr = torch.tensor([-3.0, -4.5], requires_grad=True)
    out = dpo_loss(pc, pr, rc, rr, beta=0.5)
    out.loss.backward()
    assert rc.grad is None and rr.grad is None  # constants, not trained
    # margin = (pc - rc) - (pr - rr): chosen's log-ratio minus rejected's
    margins = torch.tensor([0.5 - (-1.0), 0.0 - 0.5])
    torch.testing.assert_close(out.margins, 0.5 * margins)
    torch.testing.assert_close(out.chosen_rewards, 0.5 * torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(out.rejected_rewards, 0.5 * torch.tensor([-1.0, 0.5]))
    # beta scales both sides inside the sigmoid: loss = mean -log sigmoid(beta * m)
    torch.testing.assert_close(out.loss, -F.logsigmoid(0.5 * margins).mean())
    assert out.accuracy.item() == 0.5
    # a larger margin lowers the loss: the chosen side's gradient is negative
    assert (pc.grad < 0).all() and (pr.grad > 0).all()


def test_the_loss_at_margin_zero_is_log_2():
    same = torch.tensor([-2.0, -7.0, -1.5])
    out = dpo_loss(same, same - 1, same, same - 1, beta=3.0)
    torch.testing.assert_close(out.loss, torch.tensor(2.0).log())
    assert out.accuracy.item() == 0.0  # a tie ranks no pair right
    with pytest.raises(ValueError, match="beta must be a positive number"):
        dpo_loss(same, same, same, same, beta=0.0)
    with pytest.raises(ValueError, match="four tensors of one shape"):
        dpo_loss(same, same[:2], same, same)


def test_adapters_off_restores_the_lora_layers_even_when_the_body_raises():
    torch.manual_seed(0)
    model = SmolLM(TINY)
    apply_lora(model, 2, 4.0, ("q_proj",))
    layers = lora_layers(model)
    with pytest.raises(RuntimeError, match="inside"):
        with adapters_off(model) as bare:
            assert not lora_layers(bare)
            raise RuntimeError("inside")
    assert lora_layers(model) == layers
    with pytest.raises(ValueError, match="holds no LoRA layers"):
        with adapters_off(SmolLM(TINY)):
            pass


@pytest.mark.parametrize(
    "line, says",
    [
        ({"prompt": "q", "chosen": "a"}, "line 2: the pair has no 'rejected'"),
        ({"prompt": "q", "chosen": " ", "rejected": "b"}, "line 2: chosen is an empty"),
        (
            {"prompt": "q", "chosen": "a", "rejected": "a"},
            "line 2: chosen and rejected",
        ),
        (
            {
                "prompt": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                ],
                "chosen": "b",
                "rejected": "c",
            },
            "line 2: the prompt's last message must be the user's",
        ),
        (["q", "a", "b"], "line 2: expected an object"),
        ("{nope", "line 2: not valid JSON"),
    ],
)
def test_bad_pairs_are_named_by_file_line_and_fault(tmp_path, line, says):
    path = tmp_path / "pairs.jsonl"
    rows = [PAIRS[0], line]
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    )
    with pytest.raises(ValueError) as info:
        numbered_pairs(path)
    assert says in str(info.value) and str(path) in str(info.value)


def test_plain_pairs_are_taken_and_empty_files_refused(tmp_path):
    assert check_pair({"prompt": "q", "chosen": "a", "rejected": "b"}) == {
        "prompt": [{"role": "user", "content": "q"}],
        "chosen": "a",
        "rejected": "b",
    }
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="holds no pairs"):
        numbered_pairs(tmp_path / "empty.jsonl")


def test_a_plain_string_pair_trains_the_chat_templates_tokens(tokenizer):
    """A pair of plain strings is encoded as the conversational pair of the same
    strings: the chat template's tokens, its default system prompt included, the
    reply's scored. A version that encodes the raw strings, as TRL's plain format
    trains them, gives other tokens and fails."""
    plain = {"prompt": "What is 2 + 3?", "chosen": "5", "rejected": "It is 6."}
    (ids, labels), rejected = encode_pair(tokenizer, plain)
    assert ((ids, labels), rejected) == encode_pair(tokenizer, PAIRS[0])
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n"
    )
    scored = [t for t in labels if t != IGNORE_INDEX]
    assert tokenizer.decode(scored) == "5<|im_end|>\n"
    assert tokenizer.decode(rejected[0]).endswith("assistant\nIt is 6.<|im_end|>\n")


def test_a_reference_of_another_config_and_no_reference_without_lora_are_refused(
    tokenizer, tmp_path
):
    torch.manual_seed(0)
    other = SmolLM(with_real_vocab(512))
    with pytest.raises(ValueError, match="reference model's config differs"):
        smol_trainer(tmp_path, SmolLM(TINY), tokenizer, reference=other)
    with pytest.raises(ValueError, match="holds no LoRA layers"):
        smol_trainer(tmp_path, SmolLM(TINY), tokenizer)
    with pytest.raises(ValueError, match="beta must be a positive number"):
        smol_trainer(tmp_path, SmolLM(TINY), tokenizer, beta=-1.0, reference=other)


# --- training ----------------------------------------------------------------------


def _lora_run(tokenizer, out, steps=20, until=None, resume=False):
    torch.manual_seed(0)
    model = SmolLM(TINY)
    apply_lora(model, 4, 8.0, TARGETS)
    cfg = cpu_config(
        out,
        1e-2,
        steps=steps,
        batch_size=2,
        seq_len=64,
        warmup_steps=1,
        log_every=5,
        ckpt_every=5,
        resume=resume,
    )
    trainer = DPOTrainer(cfg, model, tokenizer, PAIRS, beta=0.5)
    return trainer, trainer.fit(until)


def _preference(trainer):
    batch = collate_pairs(trainer.train_examples, 2)
    with torch.no_grad():
        return trainer.pair_loss(trainer.model, batch)


def test_dpo_training_raises_preference_and_resumes_bit_for_bit(tokenizer, tmp_path):
    whole, history = _lora_run(tokenizer, tmp_path / "whole")
    # the first step starts from B = 0: the policy is its reference, the margin 0
    assert history["margin"][0] == pytest.approx(0.0, abs=1e-6)
    after = _preference(whole)
    assert after.accuracy.item() == 1.0 and (after.margins > 0.5).all()
    assert history["margin"][-1] > history["margin"][0] + 0.5
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    # stopped at step 10 and resumed: the same adapter and history as the whole run
    _lora_run(tokenizer, tmp_path / "parts", until=10)
    parts, resumed = _lora_run(tokenizer, tmp_path / "parts", resume=True)
    clocked = {"tokens_per_s"}  # wall-clock measures differ run to run
    assert resumed.keys() == history.keys()
    assert {k: v for k, v in resumed.items() if k not in clocked} == {
        k: v for k, v in history.items() if k not in clocked
    }
    assert resumed["margin"] and len(resumed["loss"]) == 20
    ours = {n: p for n, p in parts.model.state_dict().items() if "lora_" in n}
    theirs = whole.model.state_dict()
    assert ours and all(torch.equal(p, theirs[n]) for n, p in ours.items())
