"""The GPU check: its dry run without CUDA (bench/gpu_check.sh says so, runs the
benchmark scripts on the CPU with the tiny preset, copies their results to the folder it
is given and exits 0), the GPU-only mutants it applies, and the GPU outputs it stores in
the chapters."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from tests import gpu_mutants, nbtools

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import store_gpu_outputs  # noqa: E402


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the check runs for minutes"
)
def test_gpu_check_dry_run_on_cpu(tmp_path):
    env = {**os.environ, "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        ["bash", "bench/gpu_check.sh", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "no CUDA device here" in out and "every part passed" in out
    for name in ("train_gpu_cpu.csv", "generate_cpu.csv", "generate.log", "train.log"):
        assert (tmp_path / "out" / name).is_file(), name
    table = (tmp_path / "out" / "generate_cpu.csv").read_text()
    assert "transformers generate" in table and "smol, speculative" in table
    with open(tmp_path / "out" / "eval_all_cpu.csv", encoding="utf-8") as f:
        rows = {row["task"]: row for row in csv.DictReader(f)}
    assert len(rows) == 9 and rows["total"]["questions"] == "16", rows
    assert "gpu_check.tar.gz" in os.listdir(tmp_path / "out")
    assert "all 24 changes apply" in (tmp_path / "out" / "mutants.log").read_text()


def test_every_mutant_that_needs_a_gpu_is_applied_as_listed():
    """tests/gpu_mutants.py holds each mutant of mutants_need_a_gpu.csv as a change that
    still applies to smol's source, once, in the function mutmut names; the change is
    the one the list shows."""
    with (ROOT / "tests" / "mutants_need_a_gpu.csv").open(encoding="utf-8") as f:
        listed = {row["mutant"]: row for row in csv.DictReader(f)}
    assert {m.name for m in gpu_mutants.MUTANTS} == set(listed)
    for mutant in gpu_mutants.MUTANTS:
        source = (ROOT / mutant.file).read_text(encoding="utf-8")
        changed = gpu_mutants.mutate(source, mutant)
        assert changed != source and mutant.mutated in changed, mutant.name
        compile(changed, mutant.file, "exec")
        shown = " ".join(listed[mutant.name]["change"].split())
        assert mutant.mutated in shown or shown in changed, mutant.name
        assert f"{mutant.function}_" in mutant.name.replace("ǁ", "_"), mutant.name
        for test in mutant.tests:
            assert (ROOT / test.partition("::")[0]).is_file(), test


def test_a_change_that_is_not_in_its_function_is_refused():
    mutant = gpu_mutants.MUTANTS[0]._replace(function="rng_state")
    source = (ROOT / mutant.file).read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="no function rng_state"):
        gpu_mutants.mutate(source, mutant)
    twice = mutant._replace(function="__init__", original="self")
    with pytest.raises(ValueError, match="not once"):
        gpu_mutants.mutate(source, twice)


def notebook(tmp_path, name, output, tags=("nbval-ignore-output", "gpu-output")):
    cell = nbformat.v4.new_code_cell("print(device)")
    cell.metadata["tags"] = list(tags)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# x"), cell])
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def test_gpu_outputs_are_stored_from_a_gpus_copy_only(tmp_path):
    (tmp_path / "run").mkdir()
    chapter = notebook(tmp_path, "c.ipynb", "CUDA only: skipped on this CPU\n")
    executed = notebook(tmp_path / "run", "c.ipynb", "NVIDIA H200: 1.2 ms\n")
    for device, stored in [("CPU (PyTorch 2.13.0)", False), ("", False)]:
        nb = nbformat.read(executed, as_version=4)
        nb.metadata["smol_executed_on"] = device
        nbformat.write(nb, executed)
        with pytest.raises(SystemExit, match="not executed on a GPU"):
            store_gpu_outputs.store(chapter, executed)
    nb.metadata["smol_executed_on"] = "NVIDIA H200 (PyTorch 2.11.0)"
    nbformat.write(nb, executed)
    assert store_gpu_outputs.store(chapter, executed) == 1
    cell = nbformat.read(chapter, as_version=4).cells[1]
    assert cell.outputs[0].text == "NVIDIA H200: 1.2 ms\n"
    assert cell.metadata["gpu"] == "NVIDIA H200 (PyTorch 2.11.0)"
    nb.cells[1].source = "print(other)"  # the copy ran another cell
    nbformat.write(nb, executed)
    with pytest.raises(SystemExit, match="not the chapter's"):
        store_gpu_outputs.store(chapter, executed)
    compared = notebook(tmp_path, "d.ipynb", "x\n", tags=("gpu-output",))
    with pytest.raises(SystemExit, match="without nbval-ignore-output"):
        store_gpu_outputs.store(compared, executed)


def test_a_cpu_run_keeps_the_stored_gpu_outputs(tmp_path):
    """`python -m tests.nbtools NOTEBOOK` executes a chapter again on a CPU: the
    outputs of its gpu-output cells stay the GPU's."""
    path = notebook(tmp_path, "c.ipynb", "NVIDIA H200: 1.2 ms\n")
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = "print('CUDA only: skipped on this CPU')"
    nb.cells[1].metadata["gpu"] = "NVIDIA H200 (PyTorch 2.11.0)"
    nb.cells.append(nbformat.v4.new_code_cell("print(1 + 1)"))
    nbformat.write(nb, path)
    nbtools.execute(path, timeout=60)
    # (execute puts the shared setup cell first)
    cells = {c.source: c for c in nbformat.read(path, as_version=4).cells}
    assert cells[nb.cells[1].source].outputs[0].text == "NVIDIA H200: 1.2 ms\n"
    assert cells["print(1 + 1)"].outputs[0].text == "2\n"  # the rest ran


def test_gpu_output_cells_are_left_out_of_comparison_and_name_their_gpu():
    """A chapter cell whose stored outputs are to be a GPU's is not compared on a CPU;
    once bench/store_gpu_outputs.py has stored them, it names the GPU they came from
    and holds no CPU's output."""
    found = 0
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in nbtools.read(path).cells:
            if nbtools.GPU_TAG not in cell.metadata.get("tags", []):
                continue
            found += 1
            assert "nbval-ignore-output" in cell.metadata["tags"], path.name
            gpu = cell.metadata.get("gpu")
            if gpu is not None:
                assert gpu and not gpu.startswith("CPU"), (path.name, cell.source[:60])
                text = str(cell.outputs)
                assert "skipped on this CPU" not in text and "on a CPU" not in text
    assert found >= 5
