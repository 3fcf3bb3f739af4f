"""The autograder of the exercise notebooks.

In a notebook: ``grade("rope", apply_rope)`` runs the checks of task "rope" against your
function and shows a table (check, points, pass/fail, a hint for each failure); it never
raises. ``preview`` does the same without counting, and ``summary("rope")`` shows a
notebook's total. From the shell, ``smol grade exercises/`` runs whole
notebooks in fresh kernels and scores them.

Where things are: `registry` holds the tasks, their checks and the results; `isolation`
runs one check's probe safely (a time limit; `child` forks a process per probe, and
`memory` tells when memory ran short); `core` runs a task's checks and shows them
(`grade`, `preview`, `summary`); `runner` executes a notebook in a kernel for
`smol grade`, and `gradebook` grades a class with it; `plain` carries probe
data across processes, `reaper` ends every process grading started, `files` writes
reports; `checks` holds the checks of each exercise, and `make_exercises` writes
exercises/ from solutions/.

What a score can be trusted for. In a notebook, `grade` is feedback: it runs in the
student's own kernel, where their code may change anything. The score that counts comes
from `smol grade`, which assumes that the notebook's code may print or display
anything (a forged result included), monkeypatch `smol.grading`, `torch` or anything
else in its kernel, read its own process's memory, start processes that leave their
group and their parent, and write the files the grader writes. So the command reads
nothing that the notebook shows and runs the checks itself. Every check is a probe and a
judge (`probe_check`), decided in the command's own process, which never runs the
student's code: the probe runs in a child forked from the kernel on inputs the command
chose and hands back plain data, which the command judges against smol's reference,
computed there. Code that patches the comparisons, torch or the reference in its kernel
or its probe changes only what runs there: its outputs, which the judge compares, so it
can lose points and gain none that its outputs do not earn. Facts that a probe reports
about how the code ran (a forbidden function called, the parameters that train, the
model's forward calls, how often a tensor was written) are observed in the student's
process and are as honest as that process; the values are not. Every process a notebook
or a check starts is killed and reaped before a report is written, reports are written
atomically and never over a notebook, and the command's process is closed to others of
the same user (non-dumpable). What this does not defend against: a grader run as root,
code that edits the installed package on disk or attacks other processes of the same
user (for exams, run the command in a container, as a user who cannot write the
package); and submitting `smol`'s own implementation, which the checks cannot tell from
the student's. Checks read behaviour, not authorship.
"""

from smol.grading import checks  # noqa: F401 - registers every task
from smol.grading.core import RESULTS, grade, preview, run_checks, summary
from smol.grading.registry import MIME, TASKS, Check, Result

NOTEBOOKS = {  # topic -> file stem, in course order: exercise NN follows chapter NN
    "rmsnorm": "01_rmsnorm",
    "rope": "02_rope",
    "gqa_repeat_kv": "03_gqa_repeat_kv",
    "swiglu": "04_swiglu",
    "tying_and_init": "05_tying_and_init",
    "assembled_model": "06_assembled_model",
    "bpe": "07_bpe",
    "kv_cache_generation": "08_kv_cache_generation",
    "fast_generation": "09_fast_generation",
    "training_loop": "10_training_loop",
    "tiled_attention": "11_tiled_attention",
    "lora": "12_lora",
    "gguf": "13_gguf",
    "multiple_choice": "14_multiple_choice",
    "dpo": "15_dpo",
    "grpo": "16_grpo",
}

__all__ = [
    "grade",
    "preview",
    "summary",
    "run_checks",
    "TASKS",
    "RESULTS",
    "Check",
    "Result",
    "MIME",
    "NOTEBOOKS",
]
