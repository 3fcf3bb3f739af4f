"""The autograder of the exercise notebooks.

In a notebook: ``grade("rope", apply_rope)`` runs the checks of task "rope" against your function
and shows a table (check, points, pass/fail, a hint for each failure); it never raises. ``preview``
does the same without counting, and ``summary("rope")`` shows a notebook's total. From the shell,
``python -m smol.grade exercises/`` runs whole notebooks in fresh kernels and scores them.
"""

from smol.grading import checks  # noqa: F401 - registers every task
from smol.grading.core import MIME, RESULTS, TASKS, Check, Result, grade, preview, run_checks, summary

NOTEBOOKS = {  # topic -> file stem, in course order
    "rmsnorm": "01_rmsnorm",
    "rope": "02_rope",
    "gqa_repeat_kv": "03_gqa_repeat_kv",
    "swiglu": "04_swiglu",
    "tying_and_init": "05_tying_and_init",
    "training_loop": "06_training_loop",
    "kv_cache_generation": "07_kv_cache_generation",
    "bpe": "08_bpe",
}

__all__ = ["grade", "preview", "summary", "run_checks", "TASKS", "RESULTS", "Check", "Result", "MIME", "NOTEBOOKS"]
