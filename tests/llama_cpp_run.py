"""llama.cpp (llama-cpp-python, `make llama-cpp`) in a child process, for
tests/test_export.py. A crash inside llama.cpp then fails the one test that ran it,
naming the signal, the file and the settings, instead of ending the test run: on a
2-core Sapphire Rapids (AVX-512, AMX) llama-cpp-python 0.3.36 died of a segmentation
fault reading the bundled Q4_1 file's prompt in batches of more than one token, and
ran it with n_batch=1 (an AMD EPYC with AVX-512 and no AMX runs both).

The child reads a token sequence with logits_all=True and hands back every position's
logits; with --text, llama.cpp's own tokens for it; with --greedy N, its own greedy
continuation of --prompt (N tokens at most, through --eos):

    python -m tests.llama_cpp_run FILE OUT.npz IDS [--n-batch N] [--kv-f32]
        [--text TEXT] [--greedy N --prompt IDS [--eos ID]]

IDS are comma-separated token ids.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
N_CTX = 256


def run_llama_cpp(
    path,
    ids,
    *,
    n_batch=512,
    kv_f32=False,
    text=None,
    greedy=0,
    prompt=(),
    eos=None,
    child=None,
) -> dict:
    """llama.cpp on `path` in a child process -> {"logits": (len(ids), vocab) float32,
    "tokens": its tokens for `text`, "greedy": its greedy continuation of `prompt`, up
    to `greedy` tokens or through `eos`}. kv_f32: an F32 KV cache (llama.cpp's default
    is F16). A child killed by a signal, or failing, fails the calling test with the
    signal, the file and the settings named. `child` replaces the command (a test of
    this helper)."""
    cache = "f32" if kv_f32 else "f16"
    settings = (
        f"{Path(path).name} with n_batch={n_batch}, n_threads=1, n_ctx={N_CTX}, "
        f"{cache} KV cache"
    )
    command = child or [sys.executable, "-X", "faulthandler", "-m", __name__]
    with tempfile.TemporaryDirectory(prefix="smol-llama-") as folder:
        out = Path(folder) / "out.npz"
        argv = [str(path), str(out), ",".join(map(str, ids)), f"--n-batch={n_batch}"]
        if text is not None:
            argv.append(f"--text={text}")
        if kv_f32:
            argv.append("--kv-f32")
        if greedy:
            argv += [f"--greedy={greedy}", f"--prompt={','.join(map(str, prompt))}"]
            argv.append(f"--eos={eos if eos is not None else -1}")
        done = subprocess.run(
            [*command, *argv],
            check=False,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        if done.returncode < 0:
            name = signal.Signals(-done.returncode).name
            pytest.fail(f"llama.cpp crashed ({name}) reading {settings}\n{tail}")
        if done.returncode != 0:
            pytest.fail(
                f"llama.cpp failed (status {done.returncode}) on {settings}\n{tail}"
            )
        with np.load(out) as data:
            return {"logits": data["logits"], **json.loads(str(data["lists"]))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.llama_cpp_run")
    parser.add_argument("file")
    parser.add_argument("out")
    parser.add_argument("ids")
    parser.add_argument("--n-batch", type=int, default=512)
    parser.add_argument("--text")
    parser.add_argument("--kv-f32", action="store_true")
    parser.add_argument("--greedy", type=int, default=0)
    parser.add_argument("--prompt", default="")
    parser.add_argument("--eos", type=int, default=-1)
    args = parser.parse_args(argv)
    from llama_cpp import Llama

    ids = [int(i) for i in args.ids.split(",")]
    llm = Llama(
        args.file,
        n_ctx=N_CTX,
        n_batch=args.n_batch,
        n_threads=1,
        n_threads_batch=1,
        logits_all=True,
        verbose=False,
        seed=0,
        **({"type_k": 0, "type_v": 0} if args.kv_f32 else {}),  # GGML_TYPE_F32
    )
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    lists = {}
    if args.text is not None:
        lists["tokens"] = llm.tokenize(args.text.encode(), add_bos=False, special=True)
    if args.greedy:
        llm.reset()
        lists["greedy"] = []
        settings = {"temp": 0.0, "top_k": 1, "top_p": 1.0, "repeat_penalty": 1.0}
        prompt = [int(i) for i in args.prompt.split(",")]
        for token in llm.generate(prompt, **settings):
            lists["greedy"].append(int(token))
            if len(lists["greedy"]) == args.greedy or token == args.eos:
                break
    np.savez(args.out, logits=logits, lists=json.dumps(lists))
    return 0


if __name__ == "__main__":
    sys.exit(main())
