"""How long `load_pretrained` takes on GGUF files, and what memory it holds.

Each file is loaded in a fresh process after one untimed load (so the file is in the
page cache: a warm start), then the model runs one forward pass. The load's wall-clock
and CPU seconds are both shown: on a busy machine the first waits for the CPU. Memory
is the process's resident set from /proc/self/status beyond what importing smol took:
anonymous pages (private memory: the model's own copies) and file pages (the mapped
file, shared with the page cache), after the load and after the forward pass. Every
file is loaded as float32; a file holding F16 tensors also as float16, which keeps them
in the mapped pages.

    smol export smollm2 /tmp/smollm2.f16.gguf --type f16
    smol export smollm2 /tmp/smollm2.f32.gguf --type f32
    python bench/gguf_load.py /tmp/smollm2.f16.gguf /tmp/smollm2.f32.gguf \
        --csv bench/results/gguf_load.csv

Without files it measures the bundled Q4_1 file only."""

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, sys, time
import torch
from smol.pretrained import load_pretrained

def memory():  # MiB: (anonymous, file-backed) resident pages
    fields = dict(line.split(":") for line in open("/proc/self/status"))
    return [int(fields[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile")]

before = memory()
begin, cpu = time.perf_counter(), time.process_time()
model, _ = load_pretrained(sys.argv[1], device="cpu", dtype=getattr(torch, sys.argv[2]))
seconds, cpu = time.perf_counter() - begin, time.process_time() - cpu
loaded = memory()
with torch.no_grad():
    model(torch.tensor([[1, 2, 3]]))
ran = memory()
print(json.dumps({
    "seconds": seconds, "cpu": cpu,
    "anon_loaded": loaded[0] - before[0], "file_loaded": loaded[1] - before[1],
    "anon_ran": ran[0] - before[0], "file_ran": ran[1] - before[1],
}))
"""


def measure(path: str, dtype: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, path, dtype],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="GGUF files (default: the bundled)")
    parser.add_argument("--repeat", type=int, default=3, help="timed loads per file")
    parser.add_argument("--csv", type=Path, help="write the table here")
    args = parser.parse_args()
    from smol.gguf import GGUFFile, bundled_gguf_path

    rows = []
    for path in [str(bundled_gguf_path()), *args.files]:
        kinds = sorted({q.name for q, _, _ in GGUFFile(path).tensors.values()})
        for dtype in ["float32"] + ["float16"] * ("F16" in kinds):
            measure(path, dtype)  # warm the page cache
            runs = [measure(path, dtype) for _ in range(args.repeat)]
            seconds = statistics.median(r["seconds"] for r in runs)
            row = {
                "file": Path(path).name,
                "tensor types": "+".join(kinds),
                "dtype": dtype,
                "load seconds (median)": f"{seconds:.2f}",
                "load CPU seconds": f"{statistics.median(r['cpu'] for r in runs):.2f}",
            }
            for key, name in [
                ("anon_loaded", "private MiB after load"),
                ("file_loaded", "mapped MiB after load"),
                ("anon_ran", "private MiB after a forward"),
                ("file_ran", "mapped MiB after a forward"),
            ]:
                row[name] = f"{statistics.median(r[key] for r in runs):.0f}"
            rows.append(row)
            print(row, flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
