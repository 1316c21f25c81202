"""Where a run's warm-started policy lives, and whether it is built yet: a directory under
the cache named by a hash of everything that shapes its weights (workers/train/warmstart.py
builds it, and says what shapes it).

Kept apart from the build, which trains and so imports torch: a run's driver asks here
before every run, and finds a policy an earlier run built without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import os

from workers.config.run_config import RunConfig
from workers.model.loading import has_weights, source_dir
from workers.rollout.evaluation import HELD_OUT_BUCKETS

# Bump when the warm-start recipe (workers/train/warmstart.py) or the model format
# changes, so old caches are not reused. 5: a task's problem_key decides what the
# held-out share excludes; 4: the char vocabulary grows only for a task that uses "()#";
# 3: demonstrations per task.
RECIPE_VERSION = 5


def cache_key(cfg: RunConfig) -> str:
    """Hash of the config sections that determine the warm-started weights."""
    parts = {
        "recipe": RECIPE_VERSION,
        "model": cfg.model.model_dump(mode="json"),
        "task": cfg.task.model_dump(mode="json"),
        "warm_start": cfg.warm_start.model_dump(mode="json"),
        "seed": cfg.seed,
    }
    if cfg.model.source != "tiny":
        parts["source_files"] = _fingerprint(source_dir(cfg.model))
    if cfg.task.dataset is not None:  # an edited data file teaches other demonstrations
        parts["dataset_file"] = _file_fingerprint(cfg.task.dataset.path)
    elif cfg.eval.every_steps:  # the generator's reserved eval share is never taught
        parts["held_out_buckets"] = HELD_OUT_BUCKETS
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _fingerprint(model_dir: str) -> list[tuple[str, int, float]]:
    """(name, size, mtime) of every file in a model directory (sharded weights and the
    tokenizer included): a changed checkpoint gets a policy of its own."""
    if not os.path.isdir(model_dir):
        return []
    out = []
    for name in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            st = os.stat(path)
            out.append((name, st.st_size, st.st_mtime))
    return out


def _file_fingerprint(path: str) -> tuple[int, float] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime)


def policy_path(cfg: RunConfig, cache_dir: str) -> str:
    """The policy's directory under `cache_dir`, built or not."""
    return os.path.join(cache_dir, f"policy-{cache_key(cfg)}")


def cached_policy(cfg: RunConfig, cache_dir: str) -> str | None:
    """The policy's directory if it is built, else None."""
    target = policy_path(cfg, cache_dir)
    # A big policy is saved in shards (model.safetensors.index.json), a small one whole.
    return target if has_weights(target) else None
