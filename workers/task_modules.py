"""Which of the user's packages a run may import code from: ROLLWAY_TASK_MODULES.

A config is hostile input and importing a module runs its code, so a dotted `task.name`
(workers/rl_tasks) and each `task.reward_funcs` path (workers/reward_funcs.py) is taken
only from a top-level package the operator listed here.
"""

from __future__ import annotations

import os

MODULES_SETTING = "ROLLWAY_TASK_MODULES"


def allowed_modules() -> list[str]:
    """The top-level packages a run may import from (ROLLWAY_TASK_MODULES, read on each
    call so every process of the run, web and Ray alike, asks its own)."""
    return [m.strip() for m in os.environ.get(MODULES_SETTING, "").split(",") if m.strip()]
