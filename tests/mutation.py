"""The report of `make mutate`: what mutmut's last run killed and what survived, per
module.

`mutmut run` (configured in pyproject.toml) writes a copy of smol with every mutant in
it to `mutants/`, and each mutant's exit status beside its module
(`mutants/smol/*.py.meta`). This reads them and writes

- `bench/results/mutation.csv`: per module, mutants, not checked (not run yet: `make
  mutate MUTANTS=...` runs a part), killed (a test failed, timed out or crashed),
  survived, equivalent, no tests (no selected test reaches the code), needs a GPU
  (survivors whose change shows only on CUDA, listed), and the score: killed /
  (mutants checked - equivalent), a mutant that needs a GPU counting as not killed. A
  module this run checked nothing of keeps its row from the last report;
- `_build/mutation/survivors.md`: every surviving mutant that is not known to be
  equivalent, with its diff, to review.

A survivor is equivalent (no test can tell it from the original: a falsy default read
as False, a default argument spelled out) when `tests/mutants_equivalent.csv` names
it with the line it changes and a one-line reason. A survivor is killed outside
mutmut when `tests/mutants_killed_outside.csv` names it with its line and the test
that fails on it where mutmut cannot see that test reach the code (the DDP test runs
smol.train in torchrun's processes, the signal test in a subprocess), shown by hand:
it counts as killed. A survivor that needs a GPU is named in
`tests/mutants_need_a_gpu.csv` with its line and what goes wrong on CUDA (a tensor
left on the CPU, a GradScaler for the wrong device, two GPUs' ranks on one): no test
can tell it apart on a CPU, and `make gpu-check` is where it would show. An entry of
any list whose mutant no longer exists, or
changes another line, is reported as stale, so no list silently excuses a new
mutant.

    python -m tests.mutation          # after `mutmut run`; `make mutate` runs both
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tests" / "mutants_equivalent.csv"
KILLED_OUTSIDE = ROOT / "tests" / "mutants_killed_outside.csv"
NEED_A_GPU = ROOT / "tests" / "mutants_need_a_gpu.csv"
RESULTS = ROOT / "bench" / "results" / "mutation.csv"
SURVIVORS = ROOT / "_build" / "mutation" / "survivors.md"
KILLED = {"killed", "timeout", "segfault", "caught by type check"}


def statuses() -> dict[str, str]:
    """Every mutant of the last run and its status, e.g. 'smol.norm.x...__mutmut_3':
    'killed'."""
    from mutmut.stats import status_by_exit_code

    out = {}
    for meta in sorted((ROOT / "mutants" / "smol").glob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out.update({k: status_by_exit_code[v] for k, v in codes.items()})
    if not out:
        sys.exit(
            "no mutants found under mutants/: run `mutmut run` first (make mutate)"
        )
    return out


def change(name: str) -> str:
    """The lines a mutant adds, as its diff shows them (one line for most mutants)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=source_of(name))
    added = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+")]
    return " | ".join(a for a in added if not a.startswith("++"))


def module_of(name: str) -> str:
    """'smol.norm' for 'smol.norm.xǁRMSNormǁforward__mutmut_1' (a method) or
    'smol.rope.x_rotate_half__mutmut_2' (a function)."""
    match = re.match(r"(.*?)\.x[ǁ_]", name)
    if match is None:
        raise ValueError(f"not a mutmut mutant name: {name}")
    return match.group(1)


def source_of(name: str) -> Path:
    """The mutated copy of the module a mutant belongs to."""
    return ROOT / "mutants" / Path(*module_of(name).split(".")).with_suffix(".py")


def read_equivalent() -> dict[str, tuple[str, str]]:
    """Mutant name -> (the line it changes, why no test can tell it apart)."""
    with open(EQUIVALENT, newline="") as f:
        return {r["mutant"]: (r["change"], r["reason"]) for r in csv.DictReader(f)}


def read_killed_outside() -> dict[str, tuple[str, str]]:
    """Mutant name -> (the line it changes, the test that fails on it)."""
    with open(KILLED_OUTSIDE, newline="") as f:
        return {r["mutant"]: (r["change"], r["test"]) for r in csv.DictReader(f)}


def read_need_a_gpu() -> dict[str, tuple[str, str]]:
    """Mutant name -> (the line it changes, what goes wrong on a GPU)."""
    with open(NEED_A_GPU, newline="") as f:
        return {r["mutant"]: (r["change"], r["on a GPU"]) for r in csv.DictReader(f)}


def keep_earlier_rows(
    table: dict[str, list[str]], unchecked: list[str], fields: list[str]
) -> list[str]:
    """A module none of whose mutants this run checked (mutants/ is a local cache, and
    `make mutate MUTANTS=...` runs a part) keeps its row from the report on disk, so
    the report always holds each module's last measurement. Returns those modules."""
    if not RESULTS.exists():
        return []
    with open(RESULTS, newline="") as f:
        earlier = {r["module"]: r for r in csv.DictReader(f)}
    kept = []
    for module in unchecked:
        old = earlier.get(module)
        if old is not None and old["not checked"] != old["mutants"]:
            table[module] = [old.get(k, "0") for k in fields]  # a new column: 0
            kept.append(module)
    return kept


def main() -> None:
    status = statuses()
    known = read_equivalent()
    outside = read_killed_outside()
    gpu = read_need_a_gpu()
    rows: dict[str, Counter] = {}
    survivors, stale = [], []
    for name, s in sorted(status.items()):
        count = rows.setdefault(module_of(name), Counter())
        count["mutants"] += 1
        if s in KILLED:
            count["killed"] += 1
        elif s == "survived":
            if name in known and known[name][0] == change(name):
                count["equivalent"] += 1
            elif name in outside and outside[name][0] == change(name):
                count["killed"] += 1
            elif name in gpu and gpu[name][0] == change(name):
                count["needs a GPU"] += 1
            else:
                count["survived"] += 1
                survivors.append(name)
        elif s == "not checked":
            count["not checked"] += 1
        elif s == "no tests":
            count["no tests"] += 1
            survivors.append(name)
        else:
            count[s] += 1
    for name, (line, _) in (known | outside | gpu).items():
        if status.get(name) == "not checked":  # not run this time: nothing to say
            continue
        if status.get(name) != "survived" or change(name) != line:
            stale.append(name)

    fields = [
        "module",
        "mutants",
        "not checked",
        "killed",
        "survived",
        "equivalent",
        "no tests",
        "needs a GPU",
        "score",
    ]
    table = {}
    for module, c in rows.items():
        real = c["mutants"] - c["not checked"] - c["equivalent"]
        score = f"{100 * c['killed'] / real:.1f}" if real else ""
        table[module] = [module, *(str(c[k]) for k in fields[1:-1]), score]
    unchecked = [m for m, c in rows.items() if c["not checked"] == c["mutants"]]
    kept = keep_earlier_rows(table, unchecked, fields)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        w.writerows(row for _, row in sorted(table.items()))

    SURVIVORS.parent.mkdir(parents=True, exist_ok=True)
    with open(SURVIVORS, "w") as f:
        for name in survivors:
            from mutmut.mutation.diff_apply import get_diff_for_mutant

            diff = get_diff_for_mutant(name, path=source_of(name))
            f.write(f"## {name} ({status[name]})\n\n```diff\n{diff}\n```\n\n")

    print(RESULTS.read_text(), end="")
    print(
        f"{len(survivors)} surviving mutants to review: {SURVIVORS.relative_to(ROOT)}"
    )
    if kept:
        print(
            "not run this time, their rows kept from the last report: "
            + ", ".join(kept)
        )
    if stale:
        print("stale entries in the lists of tests/mutants_*.csv: " + ", ".join(stale))


if __name__ == "__main__":
    main()
