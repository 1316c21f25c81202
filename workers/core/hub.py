"""The Hugging Face Hub as a run config reaches it: which owners a site takes, what a
launch check may ask the Hub (metadata only), and how a worker reads a Hub dataset
within the operator's bounds.

A config is hostile input, and the web process holds the site's HF_TOKEN and serves
every team: a launch check never downloads what a member names. A model is checked by
its file list and the few small files that say what it is (`MODEL_METADATA_FILES`: its
config and tokenizer, each at most `METADATA_MAX_BYTES`); a dataset by the columns and
splits its card declares, else by the schema of the dataset viewer's Parquet
conversion (a file's footer, not its rows). Only a run's workers download data: a Hub
dataset's files up to ROLLWAY_HUB_DATASET_MAX_BYTES in all, within
ROLLWAY_HUB_DATASET_TIMEOUT_S, of which they keep the first ROLLWAY_HUB_DATASET_MAX_ROWS
rows. An `owner/name` id is always the Hub's: nothing here resolves it against the
process's working directory, as `datasets` and `transformers` would a relative path.

Two kinds of failure: `HubRefused`, the repository cannot serve the run (no such id,
gated, too large: the user changes the config), and `HubUnavailable`, the Hub did not
answer (a timeout, a refused connection, 429, 5xx: the same launch may pass later), which
the site answers with a 503 rather than a refusal of the config.

The settings are read from the environment on each call, so the web, the Celery worker
and every Ray node each ask their own (ROLLWAY_HUB_OWNERS belongs to the site's
`Confinement`, workers/run/paths.py).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

OWNERS_SETTING = "ROLLWAY_HUB_OWNERS"
TIMEOUT_SETTING = "ROLLWAY_HUB_TIMEOUT_S"
MAX_ROWS_SETTING = "ROLLWAY_HUB_DATASET_MAX_ROWS"
MAX_BYTES_SETTING = "ROLLWAY_HUB_DATASET_MAX_BYTES"
READ_TIMEOUT_SETTING = "ROLLWAY_HUB_DATASET_TIMEOUT_S"

DEFAULT_TIMEOUT_S = 15.0
DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_MAX_BYTES = 2**30
DEFAULT_READ_TIMEOUT_S = 600.0
# The clock a worker's download is timed by (a test's hook).
clock = time.monotonic
# A repository's metadata is kept this long per process: a comparison checks each of its
# runs' configs, and asks the Hub once, not once per run.
INFO_TTL_S = 60.0
_INFO_CACHE_SIZE = 1024
_info_cache: dict[tuple[str, str], tuple[float, Any]] = {}
_info_lock = threading.Lock()

# An `owner/name` repository id (the Hub's own characters).
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

# What a launch check and a run's sizing read of a Hub model: its config and the files
# its tokenizer loads from, at the repository's top level, never weights.
MODEL_METADATA_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "chat_template.jinja",
    "chat_template.json",
)
# The largest metadata file fetched: the largest tokenizers ship ~35 MB tokenizer.json.
METADATA_MAX_BYTES = 64 * 2**20
# Files of a Hub dataset a worker downloads: its card (its `configs` name the data
# files of each split) and data files of the formats workers/rollout/task_data.py reads.
DATASET_FILE_EXTENSIONS = (".parquet", ".json", ".jsonl", ".csv", ".arrow")


class HubRefused(ValueError):
    """A Hub repository that cannot serve the run; `field` is the config field naming it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class HubUnavailable(RuntimeError):
    """The Hub did not answer a check of `field` (timeout, no connection, 429, 5xx)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number (got {raw!r})") from None
    if value <= 0:
        raise ValueError(f"{name} must be > 0 (got {raw!r})")
    return value


def timeout_s() -> float:
    """Seconds one metadata request to the Hub may take (ROLLWAY_HUB_TIMEOUT_S)."""
    return _env_number(TIMEOUT_SETTING, DEFAULT_TIMEOUT_S)


def owners_from_env() -> tuple[str, ...]:
    """The Hub owners (users or organisations) whose repositories a run may name,
    ROLLWAY_HUB_OWNERS comma-separated; empty: any."""
    return tuple(o.strip() for o in os.environ.get(OWNERS_SETTING, "").split(",") if o.strip())


def is_repo_id(value: str) -> bool:
    """Whether `value` has the shape of a Hub repository id, `owner/name`."""
    return bool(REPO_ID.match(value))


def owner_problem(repo_id: str, owners: Sequence[str], field: str) -> str | None:
    """Why `repo_id` may not be named here (its owner is not in ROLLWAY_HUB_OWNERS), or None."""
    if not owners:
        return None
    owner = repo_id.split("/", 1)[0]
    if owner.lower() in {o.lower() for o in owners}:
        return None
    return (
        f"{repo_id!r}: the owner {owner!r} is not among the Hugging Face Hub owners this site allows "
        f"({OWNERS_SETTING}={','.join(owners)}); use a repository of one of them, or ask the operator to add "
        f"{owner!r} there"
    )


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def classify(exc: BaseException, field: str, repo_id: str, what: str) -> HubRefused | HubUnavailable:
    """The Hub's failure to answer about `repo_id` (a `what`: "model", "dataset") as a
    refusal of the config or as the Hub being unavailable."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return HubRefused(
            field, f"the {what} {repo_id!r} is gated on the Hugging Face Hub: accept its terms for the site's HF_TOKEN"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return HubRefused(field, f"there is no {what} {repo_id!r} on the Hugging Face Hub (or it is private)")
    if isinstance(exc, (EntryNotFoundError, RevisionNotFoundError)):
        return HubRefused(field, f"the {what} {repo_id!r} on the Hugging Face Hub lacks a file it needs ({exc})")
    if isinstance(exc, OfflineModeIsEnabled):
        return HubRefused(
            field, f"cannot ask the Hugging Face Hub about {repo_id!r}: this site is offline (HF_HUB_OFFLINE)"
        )
    status = _status(exc)
    if status is not None and (status == 429 or status >= 500):
        return HubUnavailable(field, f"the Hugging Face Hub answered {status}; try again later")
    if status is not None:
        return HubRefused(field, f"the Hugging Face Hub refused {repo_id!r} ({status})")
    if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
        return HubUnavailable(
            field, f"the Hugging Face Hub did not answer in time ({type(exc).__name__}); try again later"
        )
    return HubUnavailable(
        field, f"the Hugging Face Hub cannot be reached from this site ({type(exc).__name__}); try again later"
    )


def repo_info(repo_id: str, field: str, *, repo_type: str = "model") -> Any:
    """The Hub's metadata of `repo_id` (its files with their sizes), kept INFO_TTL_S;
    HubRefused or HubUnavailable when it cannot be had. Downloads nothing."""
    from huggingface_hub import HfApi

    what = "dataset" if repo_type == "dataset" else "model"
    if offline():
        raise HubRefused(
            field,
            f"cannot ask the Hugging Face Hub about the {what} {repo_id!r}: this site is offline (HF_HUB_OFFLINE)",
        )
    key, now = (repo_type, repo_id), time.monotonic()
    with _info_lock:
        kept = _info_cache.get(key)
    if kept is not None and now - kept[0] < INFO_TTL_S:
        return kept[1]
    api = HfApi()
    get = api.dataset_info if repo_type == "dataset" else api.model_info
    try:
        info = get(repo_id, timeout=timeout_s(), files_metadata=True)
    except Exception as exc:  # network errors come from several libraries (httpx, ssl, OSError)
        raise classify(exc, field, repo_id, what) from None
    with _info_lock:
        if len(_info_cache) >= _INFO_CACHE_SIZE:
            _info_cache.clear()
        _info_cache[key] = (now, info)
    return info


def metadata_dir(repo_id: str, field: str, info: Any = None, *, files: Sequence[str] = MODEL_METADATA_FILES) -> str:
    """A local directory holding the Hub model's config and tokenizer files (those of
    `files` it has, each at most METADATA_MAX_BYTES), from the Hugging Face cache; never
    its weights or any other file."""
    from huggingface_hub import snapshot_download

    info = info if info is not None else repo_info(repo_id, field)
    wanted = [s for s in info.siblings or [] if s.rfilename in files]
    if "config.json" in files and "config.json" not in [s.rfilename for s in wanted]:
        raise HubRefused(field, f"{repo_id!r} on the Hub is not a Hugging Face model (no config.json in it)")
    for s in wanted:
        if s.size is not None and s.size > METADATA_MAX_BYTES:
            raise HubRefused(
                field,
                f"{repo_id!r} has a {s.rfilename} of {s.size:,} bytes, more than the {METADATA_MAX_BYTES:,} a launch "
                "check reads: download the model under a model root and use model.source='path'",
            )
    try:
        return snapshot_download(
            repo_id, revision=info.sha, allow_patterns=[s.rfilename for s in wanted], etag_timeout=timeout_s()
        )
    except Exception as exc:  # as in repo_info
        raise classify(exc, field, repo_id, "model") from None


def _declared(card: dict, config: str | None) -> tuple[list[str] | None, list[str] | None]:
    """(columns, splits) the card's `dataset_info` declares for `config` (the default
    one, else the first), each None when it declares none."""
    declared = card.get("dataset_info")
    entries = declared if isinstance(declared, list) else [declared] if isinstance(declared, dict) else []
    entries = [e for e in entries if isinstance(e, dict)]
    if not entries:
        return None, None
    by_name = {e.get("config_name", "default"): e for e in entries}
    entry = by_name.get(config or "default") or entries[0]
    if config is not None and config not in by_name:
        return None, None  # the card says nothing of this configuration
    features = entry.get("features")
    columns = (
        [f["name"] for f in features if isinstance(f, dict) and "name" in f] if isinstance(features, list) else None
    )
    splits = entry.get("splits")
    names = [s["name"] for s in splits if isinstance(s, dict) and "name" in s] if isinstance(splits, list) else None
    return columns or None, names or None


def _parquet_schema(
    repo_id: str, split: str, field: str, config: str | None = None
) -> tuple[list[str] | None, list[str] | None]:
    """(columns, splits) from the dataset viewer's Parquet conversion of `config` (None:
    the default one, else the first): the split's first file's footer (its schema), read
    by range requests; (None, None) where there is none."""
    import pyarrow
    import pyarrow.parquet as pq
    from huggingface_hub import HfApi, HfFileSystem

    try:
        files = HfApi().list_dataset_parquet_files(repo_id)
    except Exception as exc:
        refused = classify(exc, field, repo_id, "dataset")
        if isinstance(refused, HubUnavailable):
            raise refused from None
        return None, None  # no conversion (the viewer is off for it): the workers check the rows
    if config is None:
        configs = {f.config for f in files}
        config = "default" if "default" in configs else min(configs, default=None)
    files = [f for f in files if f.config == config]
    splits = sorted({f.split for f in files})
    first = next((f for f in files if f.split == split), None)
    if first is None or "/resolve/" not in first.url:
        return None, splits or None
    revision_and_path = first.url.split("/resolve/", 1)[1]
    try:
        with HfFileSystem().open(f"datasets/{repo_id}@{revision_and_path}", block_size=2**16) as f:
            return list(pq.read_schema(f).names), splits
    except pyarrow.ArrowException:
        return None, splits  # a footer that does not parse: the workers check the rows
    except Exception as exc:
        raise classify(exc, field, repo_id, "dataset") from None


SUBSET_FIELD = "task.dataset.subset"


def card_configs(card: dict) -> list[str]:
    """The configurations a dataset card declares (`configs:`, else `dataset_info`'s
    config names), in its order; [] where it declares none."""
    names: list[str] = []
    for key in ("configs", "dataset_info"):
        entries = card.get(key)
        entries = entries if isinstance(entries, list) else [entries] if isinstance(entries, dict) else []
        for entry in entries:
            name = entry.get("config_name") if isinstance(entry, dict) else None
            if isinstance(name, str) and name not in names:
                names.append(name)
        if names:
            return names
    return names


def dataset_columns(
    repo_id: str, field: str, split: str, subset: str | None = None
) -> tuple[list[str] | None, list[str] | None]:
    """(columns, splits) of the Hub dataset `repo_id` (its configuration `subset`), from
    its card, else from its Parquet conversion's schema; each None where the Hub says
    nothing. HubRefused naming `task.dataset.subset` for a configuration the card does not
    declare. Downloads no rows."""
    info = repo_info(repo_id, field, repo_type="dataset")
    card = info.card_data.to_dict() if info.card_data is not None else {}
    declared = card_configs(card)
    if subset is not None and declared and subset not in declared:
        raise HubRefused(
            SUBSET_FIELD, f"{repo_id!r} has no configuration {subset!r}; its configurations are {', '.join(declared)}"
        )
    columns, splits = _declared(card, subset)
    if columns is None:
        columns, viewer_splits = _parquet_schema(repo_id, split, field, subset)
        splits = splits or viewer_splits
    return columns, splits


# -- a worker's read ----------------------------------------------------------------------


def read_bounds() -> tuple[int, int, float]:
    """(rows, bytes, seconds): what a worker reads of one Hub dataset at most."""
    rows = int(_env_number(MAX_ROWS_SETTING, DEFAULT_MAX_ROWS))
    size = int(_env_number(MAX_BYTES_SETTING, DEFAULT_MAX_BYTES))
    return rows, size, _env_number(READ_TIMEOUT_SETTING, DEFAULT_READ_TIMEOUT_S)


def download_dataset(repo_id: str, field: str, into: str) -> str:
    """The Hub dataset's card and data files, downloaded into the Hugging Face cache
    (each once per site) and linked into the directory `into`, which is returned: the
    local dataset directory `datasets` then reads. HubRefused when its data files
    exceed ROLLWAY_HUB_DATASET_MAX_BYTES (known before any is fetched) or the download
    outlasts ROLLWAY_HUB_DATASET_TIMEOUT_S."""
    from huggingface_hub import hf_hub_download

    _, max_bytes, seconds = read_bounds()
    deadline = clock() + seconds
    info = repo_info(repo_id, field, repo_type="dataset")
    files = [
        s
        for s in info.siblings or []
        if s.rfilename == "README.md" or s.rfilename.lower().endswith(DATASET_FILE_EXTENSIONS)
    ]
    data = [s for s in files if s.rfilename != "README.md"]
    if not data:
        raise HubRefused(
            field,
            f"the dataset {repo_id!r} on the Hugging Face Hub has no data files Rollway reads "
            f"({', '.join(DATASET_FILE_EXTENSIONS)})",
        )
    total = sum(s.size or 0 for s in files)
    if total > max_bytes:
        raise HubRefused(
            field,
            f"the dataset {repo_id!r} holds {total:,} bytes of data files, more than this site reads of a Hub "
            f"dataset ({MAX_BYTES_SETTING}={max_bytes:,}); save a part of it under a data root and give that path",
        )
    for s in files:
        if clock() > deadline:
            raise HubRefused(
                field,
                f"downloading the dataset {repo_id!r} took longer than {READ_TIMEOUT_SETTING}={seconds:g} s; save it "
                "under a data root and give that path",
            )
        try:
            cached = hf_hub_download(
                repo_id, s.rfilename, repo_type="dataset", revision=info.sha, etag_timeout=timeout_s()
            )
        except Exception as exc:
            raise classify(exc, field, repo_id, "dataset") from None
        link = os.path.join(into, s.rfilename)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(cached, link)
    return into
