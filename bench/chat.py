"""Time to the first token of a chat reply at turn 10, with the KV cache kept across
turns (the new message is all the model reads) and without (it re-reads the whole
conversation).

    python bench/chat.py [--turns 10] [--reply-tokens 32] [--threads N] [--csv FILE]
"""

from __future__ import annotations

import argparse
import time

import torch
from common import write_csv

from smol.chat import ChatSession
from smol.pretrained import load_pretrained

QUESTIONS = [
    "What is the capital of France?",
    "And of Germany?",
    "Name a river in Spain.",
    "What is two plus three?",
    "Name three primary colors.",
    "What do bees make?",
    "How many legs has a spider?",
    "What is ice made of?",
    "Name a planet near the Sun.",
    "What is the capital of Italy?",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--reply-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--csv", help="write the table here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(device="cpu")
    sessions = {
        "cache kept across turns": ChatSession(model, tokenizer),
        "conversation re-read each turn": ChatSession(
            model, tokenizer, reuse_cache=False
        ),
    }
    rows = []
    for name, session in sessions.items():
        for turn in range(args.turns):
            first = []
            start = time.perf_counter()
            session.send(
                QUESTIONS[turn % len(QUESTIONS)],
                args.reply_tokens,
                temperature=0,
                stream=lambda tok: first or first.append(time.perf_counter()),
            )
        ttft = first[0] - start
        rows.append(
            [name, args.turns, len(session.cached), session.fed, f"{ttft * 1e3:.0f}"]
        )
        print(
            f"{name:32s} turn {args.turns}: {session.fed:4d} tokens read for "
            f"{len(session.cached)} in the conversation, first token after "
            f"{ttft * 1e3:.0f} ms",
            flush=True,
        )
    if args.csv:
        header = ["chat", "turn", "tokens in the conversation"]
        header += ["tokens read for the reply", "time to first token (ms)"]
        write_csv(args.csv, header, rows)


if __name__ == "__main__":
    main()
