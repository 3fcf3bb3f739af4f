"""Notebook consistency: the shared setup cell, the table of contents, and the code
chapters show equal to smol's code."""

import ast
import builtins
import re

import nbformat
import pytest

from tests import nbtools

# What each chapter shows as smol holds it: its `# smol/...` cells, in order. A chapter
# not listed here fails until it says what it shows (an empty list for one that builds
# nothing).
SHOWN = {
    "00_the_model_at_a_glance": [],  # the overview: builds nothing
    "01_rmsnorm": ["# smol/norm.py"],
    "02_rope": [
        "# smol/rope.py: rotate_half, apply_rope",
        "# smol/rope.py: RotaryEmbedding",
        "# smol/rope.py",
    ],
    "03_attention_and_gqa": ["# smol/attention.py"],
    "04_swiglu": ["# smol/mlp.py"],
    "05_tying_and_init": [
        "# smol/model.py: SmolLM.tie_weights",
        "# smol/model.py: SmolLM.reset_parameters",
        "# smol/model.py: SmolLM.tie_weights, SmolLM.reset_parameters",
    ],
    "06_the_assembled_model": [
        "# smol/model.py: DecoderLayer",
        "# smol/model.py: SmolModel",
        "# smol/model.py: SmolLM",
        "# smol/model.py: _check_tensor, _check_range, check_state_dict",
        "# smol/model.py",
    ],
    "07_the_tokenizer": ["# smol/bpe.py"],
    "08_running_the_real_smollm2": [
        "# smol/kv_cache.py: KVCache",
        "# smol/generate.py: filter_top_k, filter_top_p, sample_next_token",
    ],
    "09_fast_generation": [
        "# smol/quantize.py",
        "# smol/prepack.py",
        "# smol/static_cache.py",
        "# smol/speculative.py",
    ],
    "10_training": [
        "# smol/optim.py: lr_schedule, param_groups",
        "# smol/train.py: Trainer.train_step",
    ],
    "11_sdpa_on_a_gpu": [
        "# smol/flops.py: num_params, flops_per_token, peak_flops",
        "# smol/optim.py: amp_dtype",
    ],
    "12_fine_tuning_with_lora": ["# smol/lora.py", "# smol/sft.py"],
    "13_shipping_your_model": ["# smol/export.py"],
    "14_measuring_the_model": ["# smol/evaluate.py", "# smol/stats.py"],
    "15_preference_tuning": ["# smol/dpo.py"],
    "16_learning_from_rewards": ["# smol/grpo.py"],
}

# Modules of smol that no chapter shows, on purpose; every other module is shown.
NOT_SHOWN = {
    "smol/__init__.py": "the package's exports",
    "smol/__main__.py": "`python -m smol VERB`, the `smol` command",
    "smol/commands/": "the command lines, one a verb, around the library",
    "smol/benchmarks.py": (
        "the model card's other benchmarks: lm-evaluation-harness's prompt for each "
        "set, scored by chapter 14's evaluate.score"
    ),
    "smol/int4.py": (
        "the GGUF file's own Q4_1 codes through PyTorch's int4 kernel: chapter 9 reads "
        "those blocks by hand, the Benchmarks page measures this path"
    ),
    "smol/config.py": "a dataclass of the numbers chapter 0 tabulates",
    "smol/data.py": (
        "corpus plumbing; chapter 10 shows what it produces (packed windows, targets)"
    ),
    "smol/tokenizer.py": "a wrapper of the `tokenizers` library and jinja2",
    "smol/gguf.py": "a file reader; chapter 8 shows the q/k permutation it undoes",
    "smol/pretrained.py": "file and hub I/O around build_model",
    "smol/checkpoint.py": "file I/O; chapter 10 shows a resume that is exact",
    "smol/distributed.py": "torchrun plumbing",
    "smol/train_config.py": "a dataclass of a run's settings and their checks",
    "smol/interrupt.py": "signal plumbing: a clean stop at a step boundary",
    "smol/resume.py": "file I/O of a Trainer's checkpoints; chapter 10 shows a resume",
    "smol/train_report.py": "the history, progress bar, summary and loss plot of a run",
    "smol/finetune.py": "Trainer on smol.sft's batches; chapter 12 runs it",
    "smol/reference.py": "transformers' twin of a config, for parity tests and bench/",
    "smol/chat.py": "the command line's conversation around generate and its KV cache",
    "smol/grading/": "the grader, which the exercises use",
    "smol/tasks.py": (
        "arithmetic questions and their checker: chapter 15's pairs, chapter 16's task"
    ),
    "smol/grpo_rewards.py": "the reward functions that chapter 16 calls and scores",
    "smol/sources.py": "file, folder, Parquet and hub readers of `smol train --data`",
    "smol/shards.py": "token shards on disk, memory-mapped, and their manifest",
    "smol/run_inputs.py": "a run's tokenizer and --init weights, found and checked",
    "smol/grpo_train.py": (
        "GRPO on smol.train's Trainer, sampling and scoring a task's questions; "
        "chapter 16 runs it and shows smol/grpo.py, the loss it trains on"
    ),
}


def test_there_are_notebooks():
    assert any(p.parent.name == "chapters" for p in nbtools.notebooks())


@pytest.mark.parametrize(
    "path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_first_cell_is_the_shared_setup_cell(path):
    nb = nbtools.read(path)
    first = nb.cells[0]
    assert first.cell_type == "code", "the first cell must be the setup cell"
    assert first.source == nbtools.setup_cell_source(), (
        f"{path.name}: the first cell differs from the setup cell made from "
        "_config.yml's repository url"
    )
    assert nbtools.repository_url() in first.source


@pytest.mark.parametrize(
    "path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_shown_smol_source_is_smols_source(path):
    for header, body in nbtools.source_cells(nbtools.read(path)):
        assert body.rstrip("\n") == nbtools.smol_source(header).rstrip("\n"), (
            f"{path.name}: the cell '{header}' and smol's source have drifted apart"
        )


def chapters():
    return [p for p in nbtools.notebooks() if p.parent.name == "chapters"]


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_chapters_show_what_they_declare(path):
    assert path.stem in SHOWN, (
        f"{path.name}: declare in SHOWN which `# smol/...` cells it shows"
    )
    shown = [header for header, _ in nbtools.source_cells(nbtools.read(path))]
    assert shown == SHOWN[path.stem], (
        f"{path.name} shows {shown}, declared {SHOWN[path.stem]}"
    )


def test_every_module_is_shown_or_declared_not_shown():
    shown = {
        h.removeprefix("# ").partition(":")[0].strip()
        for hs in SHOWN.values()
        for h in hs
    }
    modules = {
        str(p.relative_to(nbtools.ROOT)) for p in (nbtools.ROOT / "smol").rglob("*.py")
    }
    hidden = {
        m
        for m in modules
        if any(m == k or (k.endswith("/") and m.startswith(k)) for k in NOT_SHOWN)
    }
    assert not shown & hidden, (
        f"declared not shown, yet shown: {sorted(shown & hidden)}"
    )
    missing = sorted(modules - hidden - shown)
    assert not missing, f"no chapter shows {missing}: show it, or say why in NOT_SHOWN"
    assert shown <= modules, (
        f"shown cells name missing modules: {sorted(shown - modules)}"
    )


def bound_names(tree: ast.AST) -> set[str]:
    """Every name a piece of code binds anywhere: assignments, imports, definitions,
    arguments, exception names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def parse(source: str) -> ast.AST:
    """A cell's code, without IPython's magics and shell lines."""
    lines = [
        line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))
    ]
    return ast.parse("\n".join(lines))


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_shown_cells_run_where_they_stand(path):
    """Every name a shown cell uses is a builtin, or bound in the cell, in an earlier
    cell, or in the shown cells right after it (a class and its helper shown in a row):
    the reader can call what the cells define, right there."""
    code = [c.source for c in nbtools.read(path).cells if c.cell_type == "code"]
    cells, shown = [parse(c) for c in code], [c.startswith("# smol/") for c in code]
    known = set(dir(builtins))
    for i, tree in enumerate(cells):
        if shown[i]:
            block = set()
            for j in range(i, len(cells)):
                if not shown[j]:
                    break
                block |= bound_names(cells[j])
            used = {
                n.id
                for n in ast.walk(tree)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            }
            missing = used - block - known
            header = code[i].partition("\n")[0]
            assert not missing, (
                f"{path.name}: '{header}' uses {sorted(missing)}, "
                "never defined before it"
            )
        known |= bound_names(tree)


def test_toc_lists_every_chapter_and_nothing_missing():
    pages = nbtools.toc_pages()
    chapters = {
        f"chapters/{p.stem}" for p in (nbtools.ROOT / "chapters").glob("*.ipynb")
    }
    assert chapters <= set(pages), f"not in _toc.yml: {sorted(chapters - set(pages))}"
    for page in pages:
        assert any(
            (nbtools.ROOT / page).with_suffix(s).exists() for s in (".md", ".ipynb")
        ), f"_toc.yml names {page}, which does not exist"


def _markdown(path) -> str:
    return "\n".join(
        c.source for c in nbtools.read(path).cells if c.cell_type == "markdown"
    )


@pytest.mark.parametrize(
    "path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_markdown_reads_the_same_in_colab(path):
    """MyST roles ({cite}, {doc}, ...) show as raw text in Colab and Jupyter: notebooks
    use plain markdown links, which the book resolves too. A link to a paper names an
    entry of book/references.bib (its url, or its doi)."""
    text = _markdown(path)
    roles = re.findall(r"\{[a-z:]+\}`[^`]*`", text)
    assert not roles, f"{path.name}: MyST roles that Colab shows as raw text: {roles}"
    bib = (nbtools.ROOT / "book" / "references.bib").read_text()
    known = set(re.findall(r"url\s*=\s*\{([^}]+)\}", bib))
    known |= {"https://doi.org/" + d for d in re.findall(r"doi\s*=\s*\{([^}]+)\}", bib)}
    papers = re.findall(r"\]\((https://(?:arxiv\.org|doi\.org)/[^)\s]+)\)", text)
    assert set(papers) <= known, (
        f"{path.name}: papers not in references.bib: {set(papers) - known}"
    )


def test_every_chapter_declares_its_exercise():
    chapters = {p.stem for p in (nbtools.ROOT / "chapters").glob("*.ipynb")}
    declared = set(nbtools.CHAPTER_EXERCISES)
    assert chapters == declared, (
        "declare each chapter's exercise (or None) in tests/nbtools.py "
        f"CHAPTER_EXERCISES: missing {sorted(chapters - declared)}, "
        f"gone {sorted(declared - chapters)}"
    )
    for exercise in filter(None, nbtools.CHAPTER_EXERCISES.values()):
        assert (nbtools.ROOT / "solutions" / f"{exercise}.ipynb").exists(), exercise


@pytest.mark.parametrize("chapter", sorted(nbtools.CHAPTER_EXERCISES))
def test_chapter_and_exercise_link_each_other(chapter):
    exercise = nbtools.CHAPTER_EXERCISES[chapter]
    if exercise is None:
        pytest.skip("this chapter has no exercise")
    number = int(chapter[:2])
    assert exercise.startswith(f"{number:02d}_"), (
        f"exercise {exercise} belongs to chapter {chapter}: number it as the chapter"
    )
    # one link style everywhere: "**Your turn:** [Exercises N: title](...)" from the
    # chapter, "[chapter N, *Title*](...)" back from the exercise
    text = _markdown(nbtools.ROOT / "chapters" / f"{chapter}.ipynb")
    target = re.escape(f"](../exercises/{exercise}.ipynb)")
    link = rf"\*\*Your turn:\*\* \[Exercises {number}: [^\]]+{target}"
    assert re.search(link, text), f"{chapter} does not link to its exercise"
    for folder in ("solutions", "exercises"):
        text = _markdown(nbtools.ROOT / folder / f"{exercise}.ipynb")
        assert text.startswith(f"# Exercises {number}: "), f"{folder}/{exercise} title"
        target = re.escape(f"*](../chapters/{chapter}.ipynb)")
        back = rf"\[chapter {number}, \*[^\]]+{target}"
        assert re.search(back, text), f"{folder}/{exercise} does not link back"


@pytest.mark.parametrize(
    "path", sorted((nbtools.ROOT / "chapters").glob("*.ipynb")), ids=lambda p: p.name
)
def test_chapter_title_is_numbered_and_ends_with_a_summary(path):
    """The navigation shows each chapter's title: it carries the chapter's number, as
    the text refers to chapters by number."""
    nb = nbtools.read(path)
    title = next(
        c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown"
    )
    assert title.startswith(f"# {int(path.stem[:2])}. "), (
        f"{path.name}: title {title!r}"
    )
    assert "## Summary" in _markdown(path), f"{path.name} has no summary"


def test_no_stored_output_mentions_iprogress():
    """smol quiets tqdm's "IProgress not found" notice itself (smol/__init__.py); no
    notebook needs an environment variable or a warnings filter of its own for it."""
    for path in nbtools.notebooks():
        nb = nbtools.read(path)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert "IProgress" not in cell.source, (
                    f"{path.name}: a cell handles IProgress"
                )
                assert "IProgress" not in str(cell.get("outputs", [])), (
                    f"{path.name}: IProgress in outputs"
                )


def test_stored_progress_bars_are_settled():
    """No update of a progress bar may become a line of the stored output (and of the
    page)."""
    for path in nbtools.notebooks():
        assert not nbtools.settle_streams(nbtools.read(path)), (
            f"{path.name}: stored progress bars repeat; run "
            "`python -m tests.nbtools --refresh`"
        )


def test_settle_streams_stores_what_a_reader_sees():
    """A single stored bar with carriage returns, and libkineto's trace lines, count as
    changes and are settled; a stream left empty goes, and its neighbours join. The old
    check looked only after rewriting the text, so it missed an unmerged bar."""
    cell = nbformat.v4.new_code_cell("x")
    trace = "USDT:2026-01-01 00:00:00 1:1 SyncActivityProfilerHandler.cpp:52] profiler_"
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="10%\r100%\n"),
        nbformat.v4.new_output("stream", name="stderr", text=f"{trace}start\n"),
        nbformat.v4.new_output("stream", name="stdout", text=f"{trace}stop\nok\n"),
    ]
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert nbtools.settle_streams(nb)
    assert [o.text for o in cell.outputs] == ["100%\nok\n"]  # one stdout again
    assert not nbtools.settle_streams(nb)


def test_reference_titles_keep_their_capitals():
    """BibTeX styles lowercase titles; acronyms and names must be braced to survive."""
    bib = (nbtools.ROOT / "book" / "references.bib").read_text()
    for title in re.findall(r"(?m)^\s*title\s*=\s*\{(.*)\},?\s*$", bib):
        unbraced = re.sub(r"\{[^{}]*\}", "", title)
        # the first word keeps its capital
        for word in re.findall(r"[A-Za-z]\w*", unbraced)[1:]:
            assert not re.search(r".[A-Z]|[0-9]", word), f"brace {word!r} in {title!r}"
        assert "$" not in title, f"TeX math in a title shows raw: {title!r}"


@pytest.mark.parametrize(
    "path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_long_closing_source_cells_are_folded(path):
    """A closing `# smol/...` cell of more than FOLD_LINES lines repeats what the
    chapter showed in pieces: the book folds it (hide-input) rather than show it all
    again."""
    for cell in nbtools.read(path).cells:
        if cell.cell_type == "code" and cell.source.startswith("# smol/"):
            header = cell.source.partition("\n")[0]
            long = cell.source.count("\n") + 1 > nbtools.FOLD_LINES
            assert long == ("hide-input" in cell.metadata.get("tags", [])), (
                f"{path.name}: {header} (`python -m tests.nbtools --refresh`)"
            )


def test_chapter_0s_road_ahead_links_every_chapter():
    """The book's first page says where it goes: its road ahead links each chapter the
    table of contents lists, by its number and file."""
    nb = nbtools.read(nbtools.ROOT / "chapters" / "00_the_model_at_a_glance.ipynb")
    ahead = next(c.source for c in nb.cells if "## The road ahead" in c.source)
    ahead = ahead[ahead.index("## The road ahead") :]
    for path in sorted((nbtools.ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))[1:]:
        number = int(path.name[:2])
        assert f"[{number}. " in ahead and f"({path.name})" in ahead, path.name


# A reference library called in a cell: a proof that smol equals it (imports alone are
# the chapter's set-up, not a proof).
REFERENCE_LIBRARY = re.compile(
    r"\b(?:transformers|peft|trl|lm_eval|llama_cpp)\.\w|\bLlamaForCausalLM\("
    r"|\bAutoModel\w*\.|\bAutoTokenizer\.|\bPeftModel\.|\bget_peft_model\("
    r"|\bLoraConfig\(|\btrl_\w+\(|\bDPOConfig\(|\bGRPOConfig\("
)
PROOF_LINES = 16  # "about 15": what a reader takes in at a glance


def visible_proofs(nb) -> list[str]:
    """The code cells the book shows unfolded that call a reference library and hold
    more than PROOF_LINES lines that are not blank or imports."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code" or "hide-input" in cell.metadata.get("tags", []):
            continue
        lines = [
            line
            for line in cell.source.splitlines()
            if line.strip() and not line.lstrip().startswith(("import ", "from "))
        ]
        if len(lines) > PROOF_LINES and REFERENCE_LIBRARY.search("\n".join(lines)):
            found.append(f"{len(lines)} lines: {cell.source.splitlines()[0][:60]}")
    return found


@pytest.mark.parametrize(
    "path",
    sorted((nbtools.ROOT / "chapters").glob("*.ipynb")),
    ids=lambda p: p.name,
)
def test_library_proofs_are_folded(path):
    """A proof that smol equals transformers, peft, TRL, lm-eval or llama.cpp stays in
    the chapter, but a long one is folded (hide-input) under its one-line verdict: a
    learner reads the idea, not the library's internals."""
    assert visible_proofs(nbtools.read(path)) == [], path.name


def test_the_proof_check_catches_a_long_unfolded_proof():
    cell = nbformat.v4.new_code_cell(
        "from transformers import LlamaForCausalLM\n"
        + "ref = LlamaForCausalLM(config)\n"
        + "x = 1\n" * 16
    )
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert visible_proofs(nb) == ["17 lines: from transformers import LlamaForCausalLM"]
    cell.metadata["tags"] = ["hide-input"]
    assert visible_proofs(nb) == []
    short = nbformat.v4.new_code_cell(
        "ref = LlamaForCausalLM(config)\n" + "x = 1\n" * 3
    )
    assert visible_proofs(nbformat.v4.new_notebook(cells=[short])) == []
