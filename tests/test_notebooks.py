"""Notebook consistency: the shared setup cell, the table of contents, and shown code == smol's code."""

import ast
import builtins

import pytest

from tests import nbtools

# What each chapter shows as smol holds it: its `# smol/...` cells, in order. A chapter not listed
# here fails until it says what it shows (an empty list for one that builds nothing).
SHOWN = {
    "00_the_model_at_a_glance": [],  # the overview: builds nothing
    "01_rmsnorm": ["# smol/norm.py"],
    "02_rope": ["# smol/rope.py: rotate_half, apply_rope", "# smol/rope.py: RotaryEmbedding",
                "# smol/rope.py"],
    "03_attention_and_gqa": ["# smol/attention.py"],
    "04_swiglu": ["# smol/mlp.py"],
    "05_tying_and_init": ["# smol/model.py: SmolLM.tie_weights", "# smol/model.py: SmolLM.reset_parameters",
                          "# smol/model.py: SmolLM.tie_weights, SmolLM.reset_parameters"],
    "06_the_assembled_model": ["# smol/model.py: DecoderLayer", "# smol/model.py: SmolModel",
                               "# smol/model.py: SmolLM", "# smol/model.py: check_state_dict",
                               "# smol/model.py"],
    "07_the_tokenizer": ["# smol/bpe.py"],
    "08_running_the_real_smollm2": ["# smol/kv_cache.py: KVCache",
                                    "# smol/generate.py: filter_top_k, filter_top_p, sample_next_token"],
    "10_training": ["# smol/optim.py: lr_schedule, param_groups", "# smol/train.py: Trainer.train_step"],
    "11_sdpa_on_a_gpu": ["# smol/flops.py: num_params, flops_per_token, peak_flops",
                         "# smol/optim.py: amp_dtype"],
}

# Modules of smol that no chapter shows, on purpose. Every other module is shown somewhere.
NOT_SHOWN = {
    "smol/__init__.py": "the package's exports",
    "smol/__main__.py": "the command line around load_pretrained and generate",
    "smol/config.py": "a dataclass of the numbers chapter 0 tabulates",
    "smol/data.py": "corpus plumbing; chapter 10 shows what it produces (packed windows, targets)",
    "smol/tokenizer.py": "a wrapper of the `tokenizers` library and jinja2",
    "smol/gguf.py": "a file-format reader; chapter 8 shows the q/k permutation it undoes",
    "smol/pretrained.py": "file and hub I/O around build_model",
    "smol/checkpoint.py": "file I/O; chapter 10 shows a resume that is exact",
    "smol/distributed.py": "torchrun plumbing",
    "smol/train_cli.py": "the command line around Trainer",
    "smol/grade.py": "the grader's command line",
    "smol/reference.py": "transformers' twin of a config, for parity tests and benchmarks",
    "smol/grading/": "the grader, which the exercises use",
}


def test_there_are_notebooks():
    assert any(p.parent.name == "chapters" for p in nbtools.notebooks())


@pytest.mark.parametrize("path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_first_cell_is_the_shared_setup_cell(path):
    nb = nbtools.read(path)
    first = nb.cells[0]
    assert first.cell_type == "code", "the first cell must be the setup cell"
    assert first.source == nbtools.setup_cell_source(), (
        f"{path.name}: the first cell differs from the setup cell made from _config.yml's repository url")
    assert nbtools.repository_url() in first.source


@pytest.mark.parametrize("path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shown_smol_source_is_smols_source(path):
    for header, body in nbtools.source_cells(nbtools.read(path)):
        assert body.rstrip("\n") == nbtools.smol_source(header).rstrip("\n"), (
            f"{path.name}: the cell '{header}' and smol's source have drifted apart")


def chapters():
    return [p for p in nbtools.notebooks() if p.parent.name == "chapters"]


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_chapters_show_what_they_declare(path):
    assert path.stem in SHOWN, f"{path.name}: declare in SHOWN which `# smol/...` cells it shows"
    shown = [header for header, _ in nbtools.source_cells(nbtools.read(path))]
    assert shown == SHOWN[path.stem], f"{path.name} shows {shown}, declared {SHOWN[path.stem]}"


def test_every_module_is_shown_or_declared_not_shown():
    shown = {h.removeprefix("# ").partition(":")[0].strip() for hs in SHOWN.values() for h in hs}
    modules = {str(p.relative_to(nbtools.ROOT)) for p in (nbtools.ROOT / "smol").rglob("*.py")}
    hidden = {m for m in modules if any(m == k or (k.endswith("/") and m.startswith(k)) for k in NOT_SHOWN)}
    assert not shown & hidden, f"declared not shown, yet shown: {sorted(shown & hidden)}"
    assert modules - hidden <= shown, (
        f"no chapter shows {sorted(modules - hidden - shown)}: show it, or say in NOT_SHOWN why not")
    assert shown <= modules, f"shown cells name missing modules: {sorted(shown - modules)}"


def bound_names(tree: ast.AST) -> set[str]:
    """Every name a piece of code binds anywhere (assignments, imports, defs, arguments, ...)."""
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
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_shown_cells_run_where_they_stand(path):
    """Every name a shown cell uses is a builtin, or bound in the cell, in an earlier cell, or in
    the shown cells right after it (a class and its helper shown in a row): the reader can call
    what the cells define, right there."""
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
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            missing = used - block - known
            header = code[i].partition("\n")[0]
            assert not missing, f"{path.name}: '{header}' uses {sorted(missing)}, never defined before it"
        known |= bound_names(tree)


def test_toc_lists_every_chapter_and_nothing_missing():
    pages = nbtools.toc_pages()
    chapters = {f"chapters/{p.stem}" for p in (nbtools.ROOT / "chapters").glob("*.ipynb")}
    assert chapters <= set(pages), f"not in _toc.yml: {sorted(chapters - set(pages))}"
    for page in pages:
        assert any((nbtools.ROOT / page).with_suffix(s).exists() for s in (".md", ".ipynb")), (
            f"_toc.yml names {page}, which does not exist")
