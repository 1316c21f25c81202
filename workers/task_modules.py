"""Which of the user's packages a run may import code from: ROLLWAY_TASK_MODULES.

A config is hostile input and importing a module runs its code, so a dotted `task.name`
(workers/rl_tasks) and each `task.reward_funcs` path (workers/reward_funcs.py) is taken
only from a top-level package the operator listed here.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

MODULES_SETTING = "ROLLWAY_TASK_MODULES"


def allowed_modules() -> list[str]:
    """The top-level packages a run may import from (ROLLWAY_TASK_MODULES, read on each
    call so every process of the run, web and Ray alike, asks its own)."""
    return [m.strip() for m in os.environ.get(MODULES_SETTING, "").split(",") if m.strip()]


def import_user_module(module_name: str, prefix: str, error: type[Exception], missing: str | None = None) -> ModuleType:
    """Import a module a config names, each failure raised as `error` with a sentence
    that starts with `prefix` (the field and its value): a module that is not there says
    where to install it (or `missing`, formatted with `exc`), one that fails while
    importing says how."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if missing is not None:
            raise error(missing.format(exc=exc)) from None
        raise error(
            f"{prefix}: cannot import module {module_name!r} ({exc}); install the package that provides it on "
            "every Ray node and the site"
        ) from None
    except Exception as exc:  # the user's module failed while importing
        raise error(f"{prefix}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
