"""Launching tiny runs through the real stack and reading them back: what several
integration test modules call (test modules never import each other)."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.stack import REPO

# Tiny torch-backend runs: a warm start of 20 clean and 20 noisy steps (cached per
# stack), 4 prompts × 4 completions per step.
TINY = {
    "inference": {"backend": "torch"},
    "warm_start": {"steps": 20, "noisy_steps": 20},
    "trainer": {"batch_groups": 4, "group_size": 4},
}


def overrides(**stop) -> dict:
    return {**TINY, "stop": stop}


# Each agent of propose_solve waits this long on its environment every turn (the task's
# latency options): about two seconds an episode.
TOOL_WAIT = {"proposer_median_s": 1.0, "solver_median_s": 1.0}


def waiting_on_tools(**stop) -> dict:
    """A run that only has to keep running while a test restarts or kills what is around
    it: its episodes wait on their environment most of the time, as an agent's wait on its
    tools, so it trains a step every few seconds on a fraction of a core and the restarts
    have the cores. A run of the default task trains flat out on both cores all the while:
    in a whole suite the run-queue test spent 78 s of CPU with one, 42 s with this."""
    return {
        **overrides(**stop),
        "task": {"name": "propose_solve", "options": TOOL_WAIT},
        "buffer": {"unit": "episode"},
    }


def launch(member, preset: str, overrides: dict):
    from runs.actions import check_launch, do_launch_run

    user, experiment = member
    request = check_launch(user, experiment=experiment.pk, name="it", preset=preset, overrides=overrides)
    return do_launch_run(user, request)  # commits, then enqueues launch_run on Redis


def status(run) -> str:
    run.refresh_from_db(fields=["status", "error"])
    return run.status


def rollway(env, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """`rollway ARGS` as a person runs it, from the repository, with `env` (cli_env's)."""
    return subprocess.run(
        [sys.executable, "-m", "rollway_cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
