"""A task's prompts from data (`task.dataset`), read with Hugging Face `datasets`: a data
file (its format from its extension, `FORMATS`), a local dataset directory
(`save_to_disk`'s, or a directory of data files), or a Hub dataset id (`owner/name`).

The rows' prompt and answer columns are named by `task.dataset.prompt_column` /
`answer_column`; a prompt is text, or a list of role/content messages (TRL's
conversational format), carried as workers/core/chat.py writes it. With `task.reward_funcs`
a row's answer carries all its columns (workers/rl_tasks/reward_funcs.py). The rows are
shuffled by `task.dataset.split_seed`, then split: the first `eval_fraction` of them are
held out for evaluation, the rest train (or `eval_path` is a file of its own, or
`eval_split` a split of the same dataset). The split is the data's, not the run's: runs
under every seed hold out the same rows, so a model trained under one seed never meets
its training rows as another's held-out ones. The train rows come in an order shuffled by
the run's seed. Inference worker `i` of `n` draws the train rows `i, i+n, …` in turn,
reshuffled each pass, so inference workers never draw the same prompt in the same pass.

A model directory the engine writes from a dataset run (a warm start, a checkpoint, an
export) records the split it trained on in `SPLIT_FILE` (`split_record`); a run from it
that holds out other rows of the same data is refused (`split_refusal`).

A local path is confined under the operator's data roots (workers/run/paths.py) before
this module ever opens it. A Hub dataset is checked at launch by its metadata only
(`hub_metadata_errors`); a run's workers download it within the site's bounds
(workers/core/hub.py) and read it as a local dataset directory. A task without a dataset
samples its own synthetic prompts:
`train_prompts` and `worker_prompts` then return the task itself, which has the same
`sample(n, rng)`.

Module name: `datasets` would shadow the library it uses for anyone running a file
from inside `workers/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workers.core import chat
from workers.core.char_vocab import DEFAULT_CHARS
from workers.core.hub import (
    SUBSET_FIELD,
    HubRefused,
    HubUnavailable,
    dataset_columns,
    download_dataset,
    read_bounds,
)
from workers.model.tokenizer import load_tokenizer
from workers.rl_tasks.reward_funcs import PASSED, resolve, row_answer

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig

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


# What a model directory trained on a dataset's split records of it (`split_record`).
SPLIT_FILE = "rollway_split.json"


@dataclass(frozen=True)
class Splits:
    train: list[tuple[str, str]]
    eval: list[tuple[str, str]]
    # `split_record`'s: which rows of which data are held out.
    record: dict | None = None


# A Hugging Face Hub dataset id, `owner/name` (the Hub's own characters). A local path is
# absolute, starts with "." or "~", or names a data file (FORMATS).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# The column TRL's conversational language-modelling datasets keep their turns in.
MESSAGES_COLUMN = "messages"


def is_hub_id(path: str) -> bool:
    """Whether `task.dataset.path` names a Hub dataset rather than a local file or directory."""
    return bool(_HUB_ID.match(path)) and os.path.splitext(path)[1].lower() not in FORMATS


def _loader_failed(field: str, path: str, exc: BaseException) -> DatasetLoadError:
    return DatasetLoadError(
        f"{field}: loading {path!r} failed inside the datasets library ({type(exc).__name__}: {exc}); "
        "nothing was found wrong with the data, and the same launch may succeed on another try"
    )


def _split_of(loaded, path: str, split: str, split_field: str):
    """The split `split` of what `datasets` loaded (a Dataset, or a DatasetDict by name)."""
    import datasets

    if not isinstance(loaded, datasets.DatasetDict):
        if split != "train":
            raise DatasetError(split_field, f"{path!r} holds one split, not a {split!r} split; set it to 'train'")
        return loaded
    if split not in loaded:
        raise DatasetError(split_field, f"{path!r} has no split {split!r}; its splits are {', '.join(loaded)}")
    return loaded[split]


def _no_subset(path: str, subset: str | None, what: str) -> None:
    if subset is not None:
        raise DatasetError(SUBSET_FIELD, f"{path!r} is {what}, with no configurations to choose from; leave it null")


def _unknown_subset(exc: Exception, path: str, subset: str | None) -> DatasetError | None:
    """The DatasetError for `datasets`' refusal of a configuration name, else None."""
    text = str(exc)
    if subset is not None and ("BuilderConfig" in text or "config name" in text.lower()):
        return DatasetError(SUBSET_FIELD, f"{path!r} has no configuration {subset!r}: {text}")
    return None


def _load_table(path: str, field: str, split: str, split_field: str, subset: str | None = None):
    """The rows of `path` (a data file, a local dataset directory, or a Hub dataset id;
    its configuration `subset` where it has several) as a `datasets.Dataset`:
    DatasetError for data that cannot be read, naming `field`."""
    import datasets  # heavy (pyarrow): only where a dataset is read

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    _keep_progress_bar_lock()
    if is_hub_id(path):
        return _load_hub(path, field, split, split_field, subset)
    builder = FORMATS.get(os.path.splitext(path)[1].lower())
    if os.path.isdir(path):
        if any(os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json")):
            _no_subset(path, subset, "a saved dataset (save_to_disk)")
            try:
                loaded = datasets.load_from_disk(path, keep_in_memory=True)
            except Exception as exc:
                raise DatasetError(
                    field, f"{path!r} cannot be read as a saved dataset: {type(exc).__name__}: {exc}"
                ) from None
            return _split_of(loaded, path, split, split_field)
        builder, data_files = path, None  # a directory of data files: `datasets` infers their format and splits
    elif builder is None:
        raise DatasetError(
            field,
            f"{path!r} has no known extension; use one of {', '.join(FORMATS)}, a dataset directory, "
            "or a Hub dataset id 'owner/name'",
        )
    elif not os.path.isfile(path):
        raise DatasetError(field, f"{path!r} is not a file or a directory")
    else:
        data_files = path
        _no_subset(path, subset, "one file")
        if split != "train":
            raise DatasetError(split_field, f"{path!r} is one file, read as the split 'train'; set it to 'train'")
    try:
        # A throwaway cache: the rows are kept in memory, nothing is left on disk.
        with tempfile.TemporaryDirectory(prefix="rollway-data-") as cache:
            return datasets.load_dataset(
                builder, subset, data_files=data_files, split=split, cache_dir=cache, keep_in_memory=True
            )
    except Exception as exc:  # pyarrow, json and csv errors share no base class
        if isinstance(exc, ValueError) and str(exc).startswith("Unknown split"):
            raise DatasetError(split_field, f"{path!r}: {exc}") from None
        unknown = _unknown_subset(exc, path, subset)
        if unknown is not None:
            raise unknown from None
        fault = _file_fault(exc)
        if fault is None:
            raise _loader_failed(field, path, exc) from exc
        raise DatasetError(field, f"{path!r} cannot be read as {builder}: {type(fault).__name__}: {fault}") from None


def _load_hub(hub_id: str, field: str, split: str, split_field: str, subset: str | None = None):
    """A Hub dataset as a worker reads it (workers/core/hub.py): its card and data files
    downloaded within the site's bounds of bytes and time, read as a local dataset
    directory, its first ROLLWAY_HUB_DATASET_MAX_ROWS rows kept. The id is always the
    Hub's: no local directory of that name is read instead."""
    import datasets

    max_rows, _, _ = read_bounds()
    with tempfile.TemporaryDirectory(prefix="rollway-hub-") as scratch:
        try:
            local = download_dataset(hub_id, field, os.path.join(scratch, "files"))
        except (HubRefused, HubUnavailable) as exc:
            raise DatasetError(exc.field, exc.message) from None
        try:
            loaded = datasets.load_dataset(
                local, subset, split=split, cache_dir=os.path.join(scratch, "cache"), keep_in_memory=True
            )
        except ValueError as exc:
            if str(exc).startswith("Unknown split"):
                raise DatasetError(split_field, f"{hub_id!r}: {exc}") from None
            unknown = _unknown_subset(exc, hub_id, subset)
            if unknown is not None:
                raise unknown from None
            raise DatasetError(field, f"{hub_id!r} cannot be read: {exc}") from None
        except Exception as exc:
            fault = _file_fault(exc)
            if fault is None:
                raise _loader_failed(field, hub_id, exc) from exc
            raise DatasetError(field, f"{hub_id!r} cannot be read: {type(fault).__name__}: {fault}") from None
    return loaded.select(range(max_rows)) if len(loaded) > max_rows else loaded


def _prompt_column(columns: list[str], cfg_column: str) -> str:
    if cfg_column in columns:
        return cfg_column
    if cfg_column == "prompt" and MESSAGES_COLUMN in columns:
        return MESSAGES_COLUMN
    raise DatasetError(
        "task.dataset.prompt_column", f"has no column {cfg_column!r}; its columns are {', '.join(columns)}"
    )


def _prompt_text(value, column: str) -> tuple[str, bool] | None:
    """A row's prompt as the engine carries it, and whether it is conversational; None
    for a value that is neither text nor messages. A `messages` row's last assistant
    turn is its reference, not its prompt."""
    if column == MESSAGES_COLUMN and chat.is_messages(value) and value[-1]["role"] == "assistant":
        value = value[:-1]
    if chat.is_messages(value):
        return chat.encode(value), True
    if isinstance(value, str) and value:
        return value, False
    return None


def check_columns(columns: list[str], path: str, field: str, cfg: RunConfig) -> tuple[str, list, list[str]]:
    """(prompt column, reward functions, columns passed to them) of a dataset with
    `columns`: DatasetError naming the field when a column the run reads is missing."""
    ds_cfg = cfg.task.dataset
    if ds_cfg is None:
        raise ValueError("task.dataset is not set")
    try:
        prompt_column = _prompt_column(columns, ds_cfg.prompt_column)
    except DatasetError as exc:
        raise DatasetError(exc.field, f"{path!r} {exc.message}") from None
    funcs = resolve(cfg.task.reward_funcs, cfg.task.reward_weights) if cfg.task.reward_funcs else []
    # Reward functions read whatever columns they name; the task's own reward and the
    # warm start's demonstrations read the answer column.
    warm_start = bool(cfg.warm_start.steps or cfg.warm_start.noisy_steps)
    if (not funcs or warm_start) and ds_cfg.answer_column not in columns:
        why = " (the warm start's demonstrations need it)" if funcs else ""
        raise DatasetError(
            "task.dataset.answer_column",
            f"{path!r} has no column {ds_cfg.answer_column!r}{why}; its columns are {', '.join(columns)}",
        )
    passed = [c for c in columns if c != prompt_column]
    clash = sorted(set(passed) & set(PASSED)) if funcs else []
    if clash:
        raise DatasetError(field, f"{path!r} has columns named as reward-function arguments: {clash}; rename them")
    for f in funcs:
        missing = sorted(f.needs() - set(passed))
        if missing:
            raise DatasetError(
                "task.reward_funcs",
                f"{f.path!r} takes {', '.join(map(repr, missing))} but {path!r} passes no such column (its columns "
                f"besides the prompt: {', '.join(passed) or 'none'}); give the argument a default, or add the column",
            )
    return prompt_column, funcs, passed


def read_rows(
    path: str,
    field: str,
    cfg: RunConfig,
    split: str = "train",
    split_field: str = "task.dataset.split",
    subset: str | None = None,
) -> list[tuple[str, str]]:
    """(prompt, answer) of every row of `path` (its configuration `subset`, its split
    `split`), named `field` in errors. With `task.reward_funcs` the answer is the row's
    columns (reward_funcs.row_answer)."""
    ds_cfg = cfg.task.dataset
    if ds_cfg is None:
        raise ValueError("task.dataset is not set")
    table = _load_table(path, field, split, split_field, subset)
    columns = table.column_names
    prompt_column, funcs, passed = check_columns(columns, path, field, cfg)
    rows, conversational, answers = [], None, []
    for k, record in enumerate(table):
        prompt = _prompt_text(record[prompt_column], prompt_column)
        if prompt is None:
            raise DatasetError(
                field, f"{path!r} row {k}: the prompt is empty, or neither text nor a list of role/content messages"
            )
        if conversational is None:
            conversational = prompt[1]
        elif conversational != prompt[1]:
            raise DatasetError(field, f"{path!r} row {k}: some prompts are messages and some are text; use one form")
        answer = record.get(ds_cfg.answer_column)
        if funcs:
            rows.append((prompt[0], row_answer({c: record[c] for c in passed})))
        elif answer is None:
            raise DatasetError(field, f"{path!r} row {k}: the answer is empty")
        else:
            rows.append((prompt[0], str(answer)))
        answers.append(None if answer is None else str(answer))
    if not rows:
        raise DatasetError(field, f"{path!r} has no rows")
    _check_fit(rows, answers, bool(conversational), path, field, cfg)
    return rows


def _check_fit(
    rows: list[tuple[str, str]], answers: list[str | None], conversational: bool, path: str, field: str, cfg: RunConfig
) -> None:
    """Rows the tiny char model can take: text prompts, characters it has, prompts that
    leave room for the completion (the static check in RunConfig cannot see a file's rows)."""
    if cfg.model.source != "tiny":
        return
    if conversational:
        raise DatasetError(
            field,
            f"{path!r} holds conversational prompts (role/content messages), but the tiny model has no chat "
            "template to render them: use a checkpoint with a chat template (model.source 'path' or 'hub')",
        )

    room = cfg.model.max_position_embeddings - 1 - cfg.inference.max_new_tokens
    known = set(DEFAULT_CHARS)
    for k, ((prompt, _), answer) in enumerate(zip(rows, answers, strict=True)):
        bad = sorted((set(prompt) | set(answer or "")) - known)
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


def is_conversational(rows: list[tuple[str, str]]) -> bool:
    """Whether the rows' prompts are messages (read_rows keeps a dataset to one form)."""
    return bool(rows) and chat.messages_of(rows[0][0]) is not None


def load_splits(cfg: RunConfig) -> Splits:
    """The train rows of `cfg.task.dataset` in the run's order (shuffled by `cfg.seed`)
    and its held-out rows, split by `task.dataset.split_seed`."""
    ds_cfg = cfg.task.dataset
    if ds_cfg is None:
        raise ValueError("task.dataset is not set")
    rows = read_rows(ds_cfg.path, "task.dataset.path", cfg, ds_cfg.split, subset=ds_cfg.subset)
    # Positions, not rows, are shuffled: the same draws, so with the run's seed equal to
    # split_seed the training rows come in the very order they did when the run's seed
    # also split them.
    order = list(range(len(rows)))
    random.Random(f"dataset-{cfg.seed}").shuffle(order)
    if ds_cfg.eval_path is not None or ds_cfg.eval_split is not None:
        where = ds_cfg.eval_path if ds_cfg.eval_path is not None else ds_cfg.path
        field = "task.dataset.eval_path" if ds_cfg.eval_path is not None else "task.dataset.path"
        # An eval split is of the same dataset and configuration; an eval file is one file.
        subset = ds_cfg.subset if ds_cfg.eval_path is None else None
        held = read_rows(where, field, cfg, ds_cfg.eval_split or "train", "task.dataset.eval_split", subset)
        return Splits(train=[rows[i] for i in order], eval=held, record=split_record(rows, [], ds_cfg))
    held_ids = held_out_ids(len(rows), ds_cfg.split_seed, ds_cfg.eval_fraction)
    held_set = set(held_ids)
    return Splits(
        train=[rows[i] for i in order if i not in held_set],
        eval=[rows[i] for i in held_ids],
        record=split_record(rows, held_ids, ds_cfg),
    )


def held_out_ids(n_rows: int, split_seed: int, eval_fraction: float) -> list[int]:
    """The positions (in the data's own order) of the rows held out: the first
    `eval_fraction` of them shuffled by `split_seed`."""
    order = list(range(n_rows))
    # The key a run's seed gave the shuffle when it split the rows too: split_seed 0
    # holds out exactly what a seed-0 run always held out.
    random.Random(f"dataset-{split_seed}").shuffle(order)
    n_eval = round(n_rows * eval_fraction)
    if n_eval >= n_rows:
        raise DatasetError("task.dataset.eval_fraction", f"leaves no training rows of {n_rows}; lower it or add rows")
    return order[:n_eval]


def split_record(rows: list[tuple[str, str]], held_ids: list[int], ds_cfg) -> dict:
    """What a model trained on this split records of it: the data (a hash of its rows),
    the settings that chose the held-out rows, and the split's fingerprint (a hash of the
    data and the held-out positions: equal fingerprints, equal splits)."""
    data = hashlib.sha256()
    for prompt, answer in rows:
        data.update(json.dumps([prompt, answer]).encode() + b"\n")
    dataset = data.hexdigest()[:16]
    held = sorted(held_ids)
    fingerprint = hashlib.sha256(json.dumps([dataset, held]).encode()).hexdigest()[:12]
    return {
        "dataset": dataset,
        "rows": len(rows),
        "split_seed": ds_cfg.split_seed,
        "eval_fraction": ds_cfg.eval_fraction if held else 0.0,
        "held_out": len(held),
        "fingerprint": fingerprint,
    }


def read_split_record(model_dir: str) -> dict | None:
    """The split recorded in `model_dir` (None: none recorded, e.g. a user's own checkpoint)."""
    try:
        with open(os.path.join(model_dir, SPLIT_FILE)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "fingerprint" in record and "dataset" in record else None


def write_split_record(cfg: RunConfig, out_dir: str) -> None:
    """Record the split of `cfg`'s dataset in the model directory `out_dir` (nothing for
    a task without a dataset)."""
    if cfg.task.dataset is None:
        return
    with open(os.path.join(out_dir, SPLIT_FILE), "w") as f:
        json.dump(load_splits(cfg).record, f, indent=1)


def _split_words(record: dict) -> str:
    if not record.get("held_out"):
        return f"split {record['fingerprint']} (every row trained on)"
    return (
        f"split {record['fingerprint']} (task.dataset.split_seed {record['split_seed']}, eval_fraction "
        f"{record['eval_fraction']}: {record['held_out']} of {record['rows']} rows held out)"
    )


def split_refusal(recorded: dict | None, own: dict | None, what: str) -> str | None:
    """Why a run whose split is `own` may not start from `what` (a model directory or a
    checkpoint) trained on the split `recorded`, or None: nothing recorded, other data,
    the same split, or no held-out row of this data in the run."""
    if recorded is None or own is None or recorded.get("dataset") != own["dataset"]:
        return None
    if recorded.get("fingerprint") == own["fingerprint"] or not own["held_out"]:
        return None
    fix = (
        f"set task.dataset.split_seed to {recorded['split_seed']} and task.dataset.eval_fraction to "
        f"{recorded['eval_fraction']} to hold out the rows it never trained on"
        if recorded.get("held_out")
        else "hold out rows it never trained on with task.dataset.eval_path or eval_split (and eval_fraction 0)"
    )
    return (
        f"{what} was trained on {_split_words(recorded)} of this dataset, but this run holds out "
        f"{_split_words(own)}: some of its held-out rows were that model's training rows; {fix}"
    )


def dataset_errors(cfg: RunConfig) -> dict[str, str]:
    """{dotted field: message} for a dataset this run cannot use (empty: it can)."""
    if cfg.task.dataset is None:
        return {}
    try:
        splits = load_splits(cfg)
    except DatasetError as exc:
        return {exc.field: exc.message}
    if cfg.model.source == "path" and cfg.model.path:
        refused = split_refusal(read_split_record(cfg.model.path), splits.record, f"model.path {cfg.model.path!r}")
        if refused:
            return {"task.dataset.split_seed": refused}
    if (
        is_conversational(splits.train)
        and cfg.model.source == "path"
        and cfg.model.path
        and not getattr(load_tokenizer(cfg.model.path), "has_chat_template", False)
    ):
        return {
            "task.dataset.path": f"{cfg.task.dataset.path!r} holds conversational prompts (role/content "
            f"messages), but the checkpoint at {cfg.model.path!r} has no chat template to render them: "
            "use a chat model, or give the prompts as text"
        }
    return {}


def hub_metadata_errors(cfg: RunConfig) -> dict[str, str]:
    """{dotted field: message} for a Hub dataset this run cannot use, as far as its
    metadata tells (workers/core/hub.py: the columns and splits its card or Parquet schema
    declares; no row is downloaded), and for a local eval_path. What the metadata does
    not tell, the run's driver checks on the rows it reads."""
    ds = cfg.task.dataset
    if ds is None:
        return {}
    try:
        columns, splits = dataset_columns(ds.path, "task.dataset.path", ds.split, ds.subset)
    except HubRefused as exc:
        return {exc.field: exc.message}
    for split, split_field in ((ds.split, "task.dataset.split"), (ds.eval_split, "task.dataset.eval_split")):
        if split is not None and splits is not None and split not in splits:
            return {split_field: f"{ds.path!r} has no split {split!r}; its splits are {', '.join(splits)}"}
    try:
        if columns is not None:
            check_columns(columns, ds.path, "task.dataset.path", cfg)
        if ds.eval_path is not None:
            read_rows(ds.eval_path, "task.dataset.eval_path", cfg)
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
