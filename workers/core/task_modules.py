"""Which of the user's modules a run may import code from: ROLLWAY_TASK_MODULES.

A config is hostile input and importing a module runs its code (in the web process too,
where a config is validated), so a dotted `task.name` (workers/rl_tasks) and each
`task.reward_funcs` path (workers/rl_tasks/reward_funcs.py) is taken only from a module the
operator listed: by its exact name (`examples.arithmetic.task`), or every module under a
package the operator opened explicitly with `package.*`. Listing a package's name alone
allows that one module, not what lies under it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

MODULES_SETTING = "ROLLWAY_TASK_MODULES"


def allowed_modules() -> list[str]:
    """The modules a run may import (ROLLWAY_TASK_MODULES: exact names, or `package.*`),
    read on each call so every process of the run, web and Ray alike, asks its own."""
    return [m.strip() for m in os.environ.get(MODULES_SETTING, "").split(",") if m.strip()]


def module_allowed(module_name: str, allowed: list[str]) -> bool:
    """Whether `module_name` is listed in `allowed` by name, or lies under a `package.*` entry."""
    for entry in allowed:
        if entry.endswith(".*"):
            package = entry[:-2]
            if module_name == package or module_name.startswith(package + "."):
                return True
        elif module_name == entry:
            return True
    return False


def refusal(module_name: str, what: str) -> str | None:
    """Why `module_name` may not be imported for a config (the end of a sentence naming
    the field), or None when the operator listed it."""
    allowed = allowed_modules()
    if module_allowed(module_name, allowed):
        return None
    return (
        f"module {module_name!r} is not among the {what} this site allows "
        f"({MODULES_SETTING}={','.join(allowed) or '(empty)'}); an operator lists it there (its exact name, or "
        "'package.*' for every module of a package)"
    )


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
