"""A run's driver generates and trains nothing, so its process never imports torch,
transformers or vLLM (workers/run/inference_worker.py says what torch alone costs each run):
not through its module graph (the actor classes it spawns included), nor by unpickling
the reports its actors send it."""

from __future__ import annotations

import pickle
import subprocess
import sys

from workers.core.sync_messages import SyncReport
from workers.core.watch import Watch
from workers.rollout.episode_timing import EpisodeTiming
from workers.rollout.partial_rollouts import PartialCounts
from workers.rollout.reward_stage import RewardReport
from workers.run.messages import EvalRecord, InferenceReport, StepRecord, TrainerReport

HEAVY = ("torch", "transformers", "vllm")


def test_the_drivers_process_imports_no_torch_to_spawn_a_run_and_read_its_reports():
    reports = [
        InferenceReport(
            segments=[],
            open_segment=None,
            now=1.0,
            syncs=[SyncReport("object_store", 1, 1024, trainer_ms=2.0)],
            version=1,
            error=None,
            partial=PartialCounts(aborted=1),
            evals=[EvalRecord(1, 1.0, {"eval/pass@1": 0.5})],
            episodes=[EpisodeTiming({"solver": 0.5}, 0.7)],
            watch=Watch().drain(),
        ),
        TrainerReport(steps=[StepRecord(1, 0.0, 1.0, {"loss": 0.1})], version=1, done=False, error=None),
        RewardReport(busy_s=0.1, t0=0.0, t1=1.0, lags_s=[0.01]),
    ]
    code = (
        "import pickle, sys\n"
        "import workers.run.driver\n"
        "got = pickle.loads(sys.stdin.buffer.read())\n"
        f"print(len(got), *[m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(reports), capture_output=True, check=True)
    assert out.stdout.decode().split() == [str(len(reports))], out.stdout.decode()
