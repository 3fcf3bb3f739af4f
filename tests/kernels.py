"""A second set of CPU kernels for `make test`'s second notebook pass.

Stored notebook outputs are compared on other people's machines: AVX2 and AVX-512
laptops, Apple Silicon, Colab. PyTorch picks its vectorised kernels (ATen's and
oneDNN's) by the CPU, and their sums run in different orders, so bits differ between
machines. `make test` runs the chapters a second time with the kernels set back to
PyTorch's scalar ones (`ATEN_CPU_CAPABILITY=default`, oneDNN limited to SSE4.1): on this
kernel set matrix products, softmax, reductions and bfloat16 products all round
differently from the AVX2 and AVX-512 ones, so an output that survives both passes shows
what the mathematics fixes, not what one CPU chose.

`python -m tests.kernels` prints the variables as `NAME=value` words for the shell and
fails if they do not change the kernels here (as on a machine whose native kernels are
already the scalar ones)."""

from __future__ import annotations

import os
import subprocess
import sys

SECOND = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}

# What a kernel set computes: the hash of a few results whose bits depend on it.
PROBE = """
import hashlib, torch
torch.manual_seed(0)
torch.set_num_threads(1)
a, b = torch.randn(64, 576), torch.randn(576, 1536)
results = [a @ b, torch.softmax(a, -1), a.sum(-1)]
results.append((a.bfloat16() @ b.bfloat16()).float())
digest = hashlib.sha256(b"".join(r.numpy().tobytes() for r in results)).hexdigest()
print(torch.backends.cpu.get_cpu_capability(), digest[:16])
"""


def probe(env: dict[str, str]) -> tuple[str, str]:
    """(the CPU capability PyTorch reports, a digest of its results) under `env`."""
    base = {k: v for k, v in os.environ.items() if k not in SECOND}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], out[1]


def second_kernel_set() -> dict[str, str]:
    """SECOND, after checking that it computes other bits than the native kernels."""
    native, second = probe({}), probe(SECOND)
    if native[1] == second[1]:
        raise SystemExit(
            f"the second kernel set ({second[0]}) computes the same bits as this "
            f"machine's native kernels ({native[0]}): the second notebook pass would "
            "prove nothing here"
        )
    print(
        f"second kernel pass: {native[0]} kernels -> {second[0]}",
        file=sys.stderr,
    )
    return SECOND


if __name__ == "__main__":
    print(" ".join(f"{k}={v}" for k, v in second_kernel_set().items()))
