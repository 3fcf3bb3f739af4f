"""Continue a text with the real SmolLM2 (the bundled GGUF weights by default), on CPU
or GPU, streaming the new tokens; a line on stderr says how fast it went.

    smol generate "Once upon a time" --max-new-tokens 64
    smol generate "Once upon a time" --dtype bfloat16  # fast, starts at once
    smol generate "..." --speculative 16 --draft int4 --device cpu
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from smol.commands.common import Parser, UsageError, check_text, parser, run
from smol.config import MIN_TEMPERATURE, GenerationConfig
from smol.generate import DecodingPath, decoding_path

MAX_THREADS = 1024  # more than a CPU has cores; PyTorch crashes at some 10**5
# the options that are GenerationConfig's settings under the same names
SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "compile", "speculative")


class TextStream:
    """Print tokens as they come. Decoding the whole continuation each time and printing
    what is new keeps characters that span several tokens (emoji, accents) intact."""

    def __init__(self, tokenizer, skip_special_tokens: bool, out=None):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.out = out if out is not None else sys.stdout  # looked up when made
        self.ids: list[int] = []
        self.times: list[float] = []  # time.perf_counter() as each token came
        self.printed = 0

    def __call__(self, tokens: torch.Tensor) -> None:
        """tokens (1,): this step's new token."""
        self.times.append(time.perf_counter())
        self.ids.append(int(tokens[0]))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        # an incomplete UTF-8 character: wait for its next bytes
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.printed :])
        self.out.flush()
        self.printed = len(text)


def add_sampling_options(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    """How many tokens follow, and how each is chosen."""
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0 (the default) is greedy"
    )
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None, help="in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Which weights, where and in what precision they run, and how to decode fast."""
    p.add_argument(
        "--source",
        default=None,
        help="a .gguf file, a Hugging Face folder or hub id, or a smol train "
        "run's out-dir (default: the bundled GGUF)",
    )
    p.add_argument(
        "--device", default=None, help="default: cuda when available, else cpu"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for PyTorch (torch.set_num_threads; default: PyTorch's, "
        "usually one per core)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="default: float32 on CPU, bfloat16 on GPU or with --quantize int8",
    )
    p.add_argument(
        "--quantize",
        choices=["int8"],
        default=None,
        help="weight-only int8 (per output channel) for every Linear",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile the decode step (torch.compile, a static KV cache)",
    )
    p.add_argument(
        "--speculative",
        type=int,
        default=0,
        metavar="K",
        help="greedy prompt-lookup speculative decoding with up to K draft tokens",
    )
    p.add_argument(
        "--draft",
        choices=["bfloat16", "int4"],
        default=None,
        help="with --speculative K: draft with a bfloat16 copy of the model, or (CPU) "
        "with the GGUF file's own int4 codes, instead of prompt lookup (float32's "
        "tokens, checked in float32)",
    )


def check_options(args) -> None:
    """Reject sampling and model options that cannot work, before anything is loaded
    (UsageError: exit status 2)."""
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise UsageError(f"--threads must be in [1, {MAX_THREADS}], got {args.threads}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise UsageError(
            f"--temperature must be a finite number >= 0, got {args.temperature}"
        )
    if 0 < args.temperature < MIN_TEMPERATURE:
        raise UsageError(
            f"--temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, "
            f"got {args.temperature}"
        )
    check_seed(args.seed)
    if args.source is not None and not args.source.strip():
        raise UsageError(
            "--source is empty: give a .gguf file, a model folder or a hub id, or "
            "leave it out for the bundled weights"
        )
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must lie in (0, 1], got {args.top_p}")
    if args.speculative < 0:
        raise UsageError(
            f"--speculative must be >= 0 draft tokens, got {args.speculative}"
        )
    if args.speculative and args.temperature != 0:
        raise UsageError("--speculative decodes greedily: leave --temperature at 0")
    if args.speculative and args.compile:
        raise UsageError(
            "--speculative and --compile do not combine (the verifying step "
            "changes length from step to step); choose one"
        )
    if args.draft and not args.speculative:
        raise UsageError("--draft drafts for --speculative K: give both")
    if args.draft and (args.quantize or args.dtype not in (None, "float32")):
        raise UsageError(
            f"--draft {args.draft} drafts for the float32 model, whose tokens it "
            "keeps: leave out --dtype and --quantize"
        )
    if args.draft == "int4":
        _check_int4_draft(args)
    if args.dtype == "float16" and args.quantize:
        raise UsageError("--quantize int8 takes --dtype float32 or bfloat16")
    if args.device is not None:
        _check_device(args.device)


def check_seed(seed: int | None, flag: str = "--seed") -> None:
    """A seed torch.Generator takes: a whole number from 0 to 2**64 - 1 (None: no
    seed)."""
    if seed is not None and not 0 <= seed < 2**64:
        raise UsageError(f"{flag} must lie in [0, 2**64 - 1], got {seed}")


def _check_int4_draft(args) -> None:
    if args.source is not None and not str(args.source).endswith(".gguf"):
        raise UsageError(
            "--draft int4 drafts with a GGUF file's own Q4_1 codes: give a .gguf "
            f"--source (or none: the bundled file), got {args.source}"
        )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not device.startswith("cpu"):
        raise UsageError(
            "--draft int4 runs on the CPU only (PyTorch's int4 kernel there): "
            "add --device cpu"
        )


def _check_device(name: str) -> None:
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(
            f"--device must be cpu, cuda or cuda:N, got {name!r}"
        ) from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "--device cuda, but this machine has no CUDA device "
            "(or this PyTorch was built without CUDA): use --device cpu"
        )


@dataclass(frozen=True)
class Decoding:
    """How the command decodes, decided once (decide) from the options and the
    machine, and said on stderr when the weights are loaded."""

    device: str
    dtype: torch.dtype  # the weights' and activations'
    int8: bool  # weight-only int8 Linears
    draft: str | None  # speculative decoding's draft model: "bfloat16", "int4" or none
    prepack: bool  # speculative float32 checks on weights oneDNN reordered once
    generation: GenerationConfig  # generate's settings, eos and length aside
    path: DecodingPath  # the loop generate runs with them

    def __str__(self) -> str:
        return (
            f"on {self.device}, {self.dtype}"
            + ", int8 weights" * self.int8
            + (f", {self.draft} draft" if self.draft else "")
            + ", prepacked checks" * self.prepack
            + f"; {self.path}"
        )


def generation_config(args) -> GenerationConfig:
    """generate()'s settings from the options (the tokenizer's eos comes later)."""
    return GenerationConfig(**{name: getattr(args, name) for name in SETTINGS})


def _path(generation: GenerationConfig, args) -> DecodingPath:
    """The path of one prompt (a chat without a message continues its KV cache)."""
    return decoding_path(generation, draft=args.draft is not None)


def decide(args) -> Decoding:
    """The decoding path for the options on this machine."""
    from smol import prepack

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # int8 weights want bfloat16 activations: PyTorch's int8 kernel is slow in float32
    half = (device.startswith("cuda") or args.quantize) and not args.draft
    default = torch.bfloat16 if half else torch.float32
    dtype = getattr(torch, args.dtype) if args.dtype else default
    float32 = dtype == torch.float32 and not args.quantize
    generation = generation_config(args)
    path = _path(generation, args)
    # speculative checks are of a few rows, where oneDNN's reordered weights pay off
    prepacked = path.kind == "speculative" and float32 and device.startswith("cpu")
    return Decoding(
        device,
        dtype,
        args.quantize == "int8",
        args.draft,
        prepacked and prepack.available(),
        generation,
        path,
    )


def load(args, decoding: Decoding):
    """The model and tokenizer as `decoding` says -> (model, tokenizer)."""
    import smol.pretrained
    from smol.quantize import quantize_int8_

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tokenizer = smol.pretrained.load_pretrained(
        args.source, device=decoding.device, dtype=decoding.dtype
    )
    if decoding.int8:
        quantize_int8_(model)
    print(
        f"[loaded in {time.perf_counter() - start:.1f} s {decoding}]", file=sys.stderr
    )
    if decoding.path.kind == "static":
        print(
            "[--compile: the first token waits while the decoding step compiles, "
            "a minute or more on a CPU]",
            file=sys.stderr,
        )
    return model, tokenizer


def _fit(ids: list[int], args, model) -> int:
    """How many tokens may follow the prompt: --max-new-tokens, or fewer where the
    context ends (less --speculative's drafts); a UsageError where either overflows."""
    n, k = args.max_new_tokens, args.speculative
    context = model.config.max_position_embeddings
    if n > context:  # no prompt leaves room for them
        raise UsageError(f"--max-new-tokens {n} is more than the context ({context})")
    if k >= context:
        raise UsageError(f"--speculative {k} is not less than the context ({context})")
    room = context - k  # the cache holds the drafts past the last token too
    if len(ids) >= room:
        raise ValueError(
            f"the prompt has {len(ids)} tokens; the model's context holds {context}"
            + f" (less --speculative {k})" * (k > 0)
        )
    if len(ids) + n > room:
        print(
            f"[stopping at the context's end: {room - len(ids)} new tokens at most]",
            file=sys.stderr,
        )
    return min(n, room - len(ids))


def seeded(args, device) -> torch.Generator | None:
    """Sampling's random generator, seeded by --seed (none: PyTorch's own)."""
    if args.seed is None:
        return None
    return torch.Generator(device).manual_seed(args.seed)


def stream_reply(args, decoding, model, tokenizer, ids, skip_special_tokens):
    """Stream the continuation of ids to stdout -> (the time generation started, the
    stream, which holds the new tokens and when each came)."""
    from smol.generate import generate

    n = _fit(ids, args, model)
    ids = torch.tensor([ids], device=decoding.device)
    draft = None
    if decoding.draft == "bfloat16":
        draft = copy.deepcopy(model).to(torch.bfloat16)
    elif decoding.draft == "int4":  # the GGUF file's own 4-bit codes, unchanged
        from smol.int4 import load_int4

        draft = load_int4(args.source, dtype=torch.bfloat16, fused=True)[0]
    if decoding.prepack:
        from smol import prepack

        model = prepack.prepack(model)
    stream = TextStream(tokenizer, skip_special_tokens)
    start = time.perf_counter()
    generate(
        model,
        ids,
        n,
        config=decoding.generation,
        eos_token_id=tokenizer.eos_token_id,
        draft_model=draft,
        stream=stream,
        generator=seeded(args, ids.device),
    )
    print()
    return start, stream


def speed_report(loaded: float, start: float, times: list[float]) -> str:
    """One line on how fast it went: `times` holds time.perf_counter() at each new
    token, `start` when generation began, `loaded` the seconds loading took. The
    median step leaves out the waits of a few steps: the prompt's before the first
    token, and with --compile the compiling during the next ones."""
    n, total = len(times), times[-1] - start
    line = f"[{n} new token{'s' * (n > 1)} in {total:.1f} s: {n / total:.1f} tokens/s"
    if n > 1:
        step = statistics.median(b - a for a, b in itertools.pairwise(times))
        line += f", {1 / step:.1f} at the median step"
    line += f", the first after {times[0] - start:.2f} s"
    threads = torch.get_num_threads()
    return line + f"; loaded in {loaded:.1f} s; {threads} thread{'s' * (threads > 1)}]"


def build_parser() -> Parser:
    """The parser of `smol generate`."""
    p = parser("generate", __doc__)
    p.add_argument("prompt", help="the text to continue")
    add_sampling_options(p, max_new_tokens=64)
    add_model_options(p)
    return p


def _parse(argv):
    args = build_parser().parse_args(argv)
    if not args.prompt.strip():
        raise UsageError("the prompt is empty: give a text to continue")
    check_text(args.prompt, "the prompt")
    check_options(args)
    return args


def _generate(args) -> None:
    begin = time.perf_counter()
    decoding = decide(args)
    model, tokenizer = load(args, decoding)
    loaded = time.perf_counter() - begin
    ids = tokenizer.encode(args.prompt)
    print(args.prompt, end="", flush=True)
    start, stream = stream_reply(args, decoding, model, tokenizer, ids, False)
    print(speed_report(loaded, start, stream.times), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    return run("smol generate", lambda: _parse(argv), _generate)
