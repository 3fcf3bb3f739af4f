"""llama.cpp (llama-cpp-python, `make llama-cpp`) decoding greedily in a child process,
for the benchmarks that time it beside smol: a crash inside llama.cpp ends the child,
not the benchmark, and is reported by its signal. (llama-cpp-python 0.3.36 died of a
segmentation fault on a 2-core Sapphire Rapids reading a prompt in batches of more
than one token; tests/llama_cpp_run.py does the same for the tests.)

The child loads the file once, then answers one request a line on its standard input,
{"prompt": [ids], "k": new tokens}, with the k token ids it generated, as JSON on one
line. Each request reads the prompt again, as every path of the benchmarks does."""

from __future__ import annotations

import atexit
import importlib.util
import json
import signal
import subprocess
import sys

import torch

CHILD = """
import json, sys
from llama_cpp import Llama

path, threads = sys.argv[1], int(sys.argv[2])
llm = Llama(path, n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
greedy = {"top_k": 1, "top_p": 1.0, "min_p": 0.0, "temp": 0.0, "repeat_penalty": 1.0}
for line in sys.stdin:
    request, tokens = json.loads(line), []
    llm.reset()
    for token in llm.generate(request["prompt"], **greedy):
        tokens.append(token)
        if len(tokens) == request["k"]:
            break
    print(json.dumps(tokens), flush=True)
"""


class LlamaCppCrashed(RuntimeError):
    """llama.cpp's child process ended while it worked."""


def llama_cpp(path, x, threads: int):
    """llama.cpp decoding the GGUF file at `path` greedily from the token ids x (1, T):
    a function generating k tokens, as smol's paths return them (1, T + k); None where
    llama-cpp-python is not installed. Two tokens are generated before it returns, so
    that a crash reading the prompt shows here (LlamaCppCrashed, naming the signal)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    child = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", CHILD, str(path), str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    atexit.register(child.kill)
    prompt = x[0].tolist()

    def run(k: int) -> torch.Tensor:
        try:
            child.stdin.write(json.dumps({"prompt": prompt, "k": k}) + "\n")
            child.stdin.flush()
        except BrokenPipeError:
            pass  # the child is gone: the read below says why
        line = child.stdout.readline()
        if not line:
            status = child.wait()
            why = signal.Signals(-status).name if status < 0 else f"status {status}"
            raise LlamaCppCrashed(f"llama.cpp's process ended ({why}) on {path}")
        return torch.tensor([prompt + json.loads(line)])

    run(2)
    return run
