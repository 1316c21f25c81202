"""Two answers transformers works out afresh in every process that imports it, kept on disk
so that the next process on the host reads them instead.

- `importlib.metadata.packages_distributions()`, which transformers calls at import to map
  import names to distributions: it reads every installed distribution's metadata (about
  300 of them in a set-up environment, vLLM's and torch's file lists among them).
- transformers' `define_import_structure`, which builds its lazy modules' tables by reading
  the source of every model file it ships (about 2,000) and parsing each `__all__`.

Together they were about 0.8 s of the 2.2 s of CPU that `from transformers import
AutoModelForCausalLM` costs on a 2-core host (after torch), and every process of a run that
loads a model pays it: the trainer, each rank, each inference worker. Neither answer can
change while what it was worked out from stays put, so each is kept under a key made of
exactly that: the names (with versions) of the distributions on `sys.path`, and the paths,
sizes and modification times of the files transformers would read. A file that cannot be
read or written is worked out afresh, as without the memo. The files are JSON, never
pickle: nothing read back from the cache directory can run code.

`install()` runs in Ray's worker setup hook (workers/core/worker_process.py), before
transformers is imported; the standard library only, as there.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

IMPORT_UTILS = "transformers.utils.import_utils"
# Bump when the files' layout changes, so that an older layout is never read as this one.
FORMAT = 1


def cache_dir() -> Path:
    """Where the answers are kept: the user's cache directory, as Hugging Face keeps its own
    (`$XDG_CACHE_HOME`, else `~/.cache`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rollway" / "imports"


def install() -> None:
    """Answer both from the cache in this process from now on. Once per process, and only
    before transformers is imported (after, it has already worked both out)."""
    if IMPORT_UTILS in sys.modules or isinstance(importlib.metadata.packages_distributions, _Memo):
        return
    importlib.metadata.packages_distributions = _Memo(
        importlib.metadata.packages_distributions, "packages", _installed_key, decode=_decode_packages
    )
    sys.meta_path.insert(0, _ImportUtilsFinder())


class _Memo:
    """`fn` answered from a JSON file named by a key of its arguments and of what it reads;
    `encode`/`decode` turn its answer into JSON and back."""

    def __init__(
        self,
        fn: Callable,
        name: str,
        key: Callable[..., Iterable[str]],
        encode: Callable = lambda value: value,
        decode: Callable = lambda value: value,
    ) -> None:
        self.fn, self.name, self.key, self.encode, self.decode = fn, name, key, encode, decode
        self.answers: dict = {}  # this process's: the key is not worked out twice
        self.worked_out = 0  # answers this process could not read from the cache
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        asked = (args, tuple(sorted(kwargs.items())))
        if asked not in self.answers:
            self.answers[asked] = self._answer(*args, **kwargs)
        return self.answers[asked]

    def _answer(self, *args, **kwargs):
        try:
            digest = hashlib.sha256(repr([FORMAT, *self.key(*args, **kwargs)]).encode()).hexdigest()[:32]
        except OSError:
            return self.fn(*args, **kwargs)
        path = cache_dir() / f"{self.name}-{digest}.json"
        try:
            return self.decode(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):
            pass  # not kept yet, or unreadable, or not of the answer's shape: worked out below
        value = self.fn(*args, **kwargs)
        self.worked_out += 1
        _write(path, self.encode(value))
        return value


def _write(path: Path, value) -> None:
    """Write atomically (another process may be reading the same file); a cache directory
    that cannot be written leaves the answer unkept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".writing-", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a full disk: no half-written file left behind


def _installed_key() -> list[str]:
    """What `packages_distributions()` depends on: each `sys.path` entry (in order) with
    the metadata directories it holds, whose names carry each distribution's version."""
    key = []
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info")))
        except OSError:
            names = []  # a zip, or a directory that is gone: nothing installed there
        key.append(f"{entry}:{','.join(names)}")
    return key


def _tree_key(module_path, prefix=None) -> list[str]:
    """What `define_import_structure(module_path, prefix)` reads: the Python files under
    the package `module_path` names (a folder, or a file in it), each with its size and
    modification time."""
    root = str(module_path)
    if os.path.isfile(root):
        root = os.path.dirname(root)
    return [root, str(prefix), *_python_files(root)]


@functools.lru_cache
def _python_files(root: str) -> tuple[str, ...]:
    """Each Python file under `root` with its size and modification time, walked once per
    process: transformers asks for its models' folder twice (by the folder and by its
    `__init__.py`), and walking it is about 40 ms of CPU."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(folder, name))
                found.append(f"{os.path.relpath(os.path.join(folder, name), root)}:{st.st_size}:{st.st_mtime_ns}")
    return tuple(found)


def _decode_packages(value) -> dict[str, list[str]]:
    """`packages_distributions()`'s answer ({import name: [distribution names]}) read back,
    refused (ValueError) where the file holds anything else."""
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise ValueError("not a map of import names to distributions")
    return value


def _encode_structure(structure: dict) -> list:
    """transformers' import structure ({frozenset of backends: {module: set of names}}) as
    JSON: a list of [backends, {module: names}], each set sorted."""
    return [
        [sorted(backends), {m: sorted(names) for m, names in modules.items()}]
        for backends, modules in structure.items()
    ]


def _decode_structure(value: list) -> dict:
    return {frozenset(backends): {m: set(names) for m, names in modules.items()} for backends, modules in value}


class _ImportUtilsFinder(importlib.abc.MetaPathFinder):
    """Finds transformers' import_utils module as the path finder would, and puts the memo
    in place of its `define_import_structure` as soon as the module has run, before
    `transformers` and `transformers.models` take the name from it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != IMPORT_UTILS:
            return None
        sys.meta_path.remove(self)  # once: the module is imported once per process
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module) -> None:
            run_module(module)
            found = getattr(module, "define_import_structure", None)
            # transformers' own per-process cache (functools.lru_cache) is kept under the memo.
            if callable(found) and hasattr(found, "cache_clear"):
                module.define_import_structure = _Memo(
                    found, "transformers-structure", _tree_key, _encode_structure, _decode_structure
                )

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
