"""A task's prompts from a local data file (`task.dataset`), read with Hugging Face
`datasets`.

The format comes from the file's extension (`FORMATS`); the rows' prompt and answer
columns are named by `task.dataset.prompt_column` / `answer_column`. The rows are
shuffled by the run's seed, then split: the first `eval_fraction` of them are held out
for evaluation, the rest train (or `eval_path` is a file of its own). Inference worker
`i` of `n` draws the train rows `i, i+n, …` in turn, reshuffled each pass, so inference
workers never draw the same prompt in the same pass.

The file's path is confined under the operator's data roots (workers/paths.py) before
this module ever opens it. A task without a dataset samples its own synthetic prompts:
`train_prompts` and `worker_prompts` then return the task itself, which has the same
`sample(n, rng)`.

Module name: `datasets` would shadow the library it uses for anyone running a file
from inside `workers/`.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.config import RunConfig

# Extension → the `datasets` builder that reads it.
FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
_PROGRESS_BAR_LOCK = threading.Lock()


class DatasetError(ValueError):
    """A data file that cannot serve the run; `field` is the dotted config field to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class DatasetLoadError(RuntimeError):
    """The loader failed for a reason that is not the file's: the message says so, and
    that the same file may load on another try."""


def _keep_progress_bar_lock() -> None:
    """Give tqdm's progress bars a lock that stays for the life of the process.

    `datasets` reads files through tqdm.contrib.concurrent.thread_map (even with progress
    bars disabled), whose `ensure_lock` creates the class's lock when it finds none and
    deletes it on the way out. Two loads starting together in threads of one process
    (two runs' data checks, or a worker's) can both find none; the second to leave
    deletes a lock that is already gone: AttributeError "type object 'tqdm' has no
    attribute '_lock'" out of load_dataset, with nothing wrong in the file. With a lock
    in place before any load, `ensure_lock` only ever puts the same lock back."""
    from tqdm import tqdm

    if getattr(tqdm, "_lock", None) is None:
        with _PROGRESS_BAR_LOCK:
            tqdm.get_lock()  # on the base class, so every subclass (datasets', the Hub's) finds it


def _file_fault(exc: BaseException) -> BaseException | None:
    """The error about the file's contents inside a loader error (a parse or schema
    error: datasets wraps those in DatasetGenerationError), or None when the loader
    failed for a reason of its own."""
    import pyarrow
    from datasets.exceptions import DatasetGenerationError

    while isinstance(exc, DatasetGenerationError) and exc.__cause__ is not None:
        exc = exc.__cause__
    # pyarrow's, json's, csv's (pandas) and decoding errors are ValueErrors or ArrowExceptions.
    return exc if isinstance(exc, (pyarrow.ArrowException, ValueError, OSError)) else None


@dataclass(frozen=True)
class Splits:
    train: list[tuple[str, str]]
    eval: list[tuple[str, str]]


def read_rows(path: str, field: str, cfg: RunConfig) -> list[tuple[str, str]]:
    """(prompt, answer) of every row of the file at `path`, named `field` in errors."""
    ds_cfg = cfg.task.dataset
    if ds_cfg is None:
        raise ValueError("task.dataset is not set")
    builder = FORMATS.get(os.path.splitext(path)[1].lower())
    if builder is None:
        raise DatasetError(field, f"{path!r} has no known extension; use one of {', '.join(FORMATS)}")
    if not os.path.isfile(path):
        raise DatasetError(field, f"{path!r} is not a file")
    import datasets  # heavy (pyarrow): only where a dataset is read

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    _keep_progress_bar_lock()
    try:
        # A throwaway cache: the rows are kept in memory, nothing is left on disk.
        with tempfile.TemporaryDirectory(prefix="rollway-data-") as cache:
            table = datasets.load_dataset(builder, data_files=path, split="train", cache_dir=cache, keep_in_memory=True)
    except Exception as exc:  # pyarrow, json and csv errors share no base class
        fault = _file_fault(exc)
        if fault is None:
            raise DatasetLoadError(
                f"{field}: loading {path!r} failed inside the datasets library ({type(exc).__name__}: {exc}); "
                "nothing was found wrong with the file, and the same launch may succeed on another try"
            ) from exc
        raise DatasetError(field, f"{path!r} cannot be read as {builder}: {type(fault).__name__}: {fault}") from None
    columns = table.column_names
    for name, column in (("prompt_column", ds_cfg.prompt_column), ("answer_column", ds_cfg.answer_column)):
        if column not in columns:
            raise DatasetError(
                f"task.dataset.{name}", f"{path!r} has no column {column!r}; its columns are {', '.join(columns)}"
            )
    rows = []
    for k, (prompt, answer) in enumerate(zip(table[ds_cfg.prompt_column], table[ds_cfg.answer_column], strict=True)):
        if prompt is None or answer is None or str(prompt) == "":
            raise DatasetError(field, f"{path!r} row {k}: the prompt or the answer is empty")
        rows.append((str(prompt), str(answer)))
    if not rows:
        raise DatasetError(field, f"{path!r} has no rows")
    _check_fit(rows, path, field, cfg)
    return rows


def _check_fit(rows: list[tuple[str, str]], path: str, field: str, cfg: RunConfig) -> None:
    """Rows the tiny char model can take: characters it has, prompts that leave room for
    the completion (the static check in RunConfig cannot see a file's rows)."""
    if cfg.model.source != "tiny":
        return
    from workers.tokenizer import DEFAULT_CHARS

    room = cfg.model.max_position_embeddings - 1 - cfg.inference.max_new_tokens
    known = set(DEFAULT_CHARS)
    for k, (prompt, answer) in enumerate(rows):
        bad = sorted((set(prompt) | set(answer)) - known)
        if bad:
            raise DatasetError(
                field,
                f"{path!r} row {k} has characters the tiny model's tokenizer lacks: {bad} (it has {DEFAULT_CHARS!r})",
            )
        if len(prompt) > room:
            raise DatasetError(
                field,
                f"{path!r} row {k}: its prompt ({len(prompt)} characters) does not fit with "
                f"inference.max_new_tokens ({cfg.inference.max_new_tokens}); raise model.max_position_embeddings "
                f"to ≥ {1 + len(prompt) + cfg.inference.max_new_tokens}",
            )


def load_splits(cfg: RunConfig) -> Splits:
    """The train and eval rows of `cfg.task.dataset`, shuffled by `cfg.seed`."""
    ds_cfg = cfg.task.dataset
    if ds_cfg is None:
        raise ValueError("task.dataset is not set")
    rows = read_rows(ds_cfg.path, "task.dataset.path", cfg)
    random.Random(f"dataset-{cfg.seed}").shuffle(rows)
    if ds_cfg.eval_path is not None:
        held = read_rows(ds_cfg.eval_path, "task.dataset.eval_path", cfg)
        return Splits(train=rows, eval=held)
    n_eval = round(len(rows) * ds_cfg.eval_fraction)
    if n_eval >= len(rows):
        raise DatasetError(
            "task.dataset.eval_fraction", f"leaves no training rows of {len(rows)}; lower it or add rows"
        )
    return Splits(train=rows[n_eval:], eval=rows[:n_eval])


def dataset_errors(cfg: RunConfig) -> dict[str, str]:
    """{dotted field: message} for a dataset this run cannot use (empty: it can)."""
    if cfg.task.dataset is None:
        return {}
    try:
        load_splits(cfg)
    except DatasetError as exc:
        return {exc.field: exc.message}
    return {}


class DatasetPrompts:
    """Rows drawn in turn, reshuffled (by the caller's rng) after each pass: the same
    `sample(n, rng)` a task's generator offers."""

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        if not rows:
            raise ValueError("DatasetPrompts needs at least one row")
        self.rows = list(rows)
        self.next = 0

    def sample(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        out = []
        for _ in range(n):
            if self.next == len(self.rows):
                rng.shuffle(self.rows)
                self.next = 0
            out.append(self.rows[self.next])
            self.next += 1
        return out

    def state_dict(self) -> dict:
        """The rows' order and the position of the next draw (JSON data)."""
        return {"rows": [list(r) for r in self.rows], "next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.rows = [tuple(r) for r in state["rows"]]
        self.next = int(state["next"])


def train_prompts(cfg: RunConfig, task):
    """What the warm start draws from: the dataset's train rows, or the task itself."""
    if cfg.task.dataset is None:
        return task
    return DatasetPrompts(load_splits(cfg).train)


def worker_prompts(cfg: RunConfig, task, index: int, num_workers: int):
    """What inference worker `index` draws from: its share of the train rows (every
    `num_workers`-th, from `index`; all of them when there are fewer rows than
    inference workers), or the task itself."""
    if cfg.task.dataset is None:
        return task
    train = load_splits(cfg).train
    return DatasetPrompts(train[index::num_workers] or train)
