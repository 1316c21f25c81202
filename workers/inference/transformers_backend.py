"""Torch inference for any causal LM transformers loads: its own forward and KV cache.

The hand-written loop of `torch_backend` covers the Llama family only (no bias terms,
default RoPE); every other architecture AutoModelForCausalLM knows (Qwen2's biased q/k/v,
tied embeddings, …) runs here on the model's own forward with a `DynamicCache`, under the
same contract: batched temperature sampling (then top-k / top-p / min-p), seeded, per-token logprobs of the sampled
token under log_softmax(logits / temperature), stop at any EOS id, stepped sessions for
the update modes, full weight reloads under checkpoint names. Slower per token than the
hand-written loop, and exactly the forward the trainer computes its logprobs with.
"""

from __future__ import annotations

import torch

from workers.core.routing import Recorder, RoutingRecord
from workers.inference.base import StepToken
from workers.inference.sampling import Truncation
from workers.inference.torch_backend import SteppedSampler, generate_by_steps, rows_per_sample
from workers.model.loading import load_model, model_dims, tied_weight_names


class TransformersBackend:
    """A transformers causal LM (eval mode) with a stepped sampling loop, on `device` in
    `dtype` (float32 on the CPU by default).

    Sampling runs on the same device, from a generator seeded there: on the CPU the draws
    are those of every CPU host; a GPU's generator draws other (equally seeded) tokens."""

    def __init__(
        self,
        model_dir: str,
        dtype: str = "float32",
        device: torch.device | str = "cpu",
        truncation: Truncation | None = None,
        record_routing: bool = False,
        keep_sampling_mask: bool = False,
    ) -> None:
        self.truncation = truncation or Truncation()
        self.keep_sampling_mask = keep_sampling_mask  # record each token's kept set (SteppedSampler)
        self.device = torch.device(device)
        # transformers wraps PreTrainedModel.to with functools.wraps, which mypy reads unbound.
        self.model = load_model(model_dir, dtype).to(self.device)  # type: ignore[arg-type]
        config = self.model.config
        eos = config.eos_token_id
        eos = [] if eos is None else [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]
        if not eos:
            raise ValueError(f"{model_dir}: config.json names no eos_token_id; generation could never stop")
        self.stop_ids = torch.tensor(eos, dtype=torch.long)
        self.eos_id = eos[0]
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else eos[0]
        self.max_positions = model_dims(config).positions
        self._names = set(self.model.state_dict())
        # Tied weights (an output layer that is the embedding): the trainer sends each
        # once, under its checkpoint name, as save_pretrained writes it.
        self._aliases = tied_weight_names(self.model)
        # Keep Routing (correction.keep_routing): the routers' choices of every forward,
        # taken by the session after each step. Hooks stay for the backend's life.
        recorder = Recorder(self.model) if record_routing else None
        self.recorder = recorder.__enter__() if recorder is not None and recorder.routers else None

    # ---- weights ---------------------------------------------------------------

    @torch.no_grad()
    def label_weights(self, version: int) -> None:
        """Nothing to label: weights change only between the calls the caller makes, so
        its own version tags every token exactly."""

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Full reload from checkpoint-format names (what `model.state_dict()` calls them)."""
        missing = sorted(self._names - set(state_dict) - self._aliases)
        unexpected = sorted(set(state_dict) - self._names)
        if missing or unexpected:
            raise KeyError(
                f"load_weights needs every weight of the model under its checkpoint name; "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        # load_state_dict copies into the live parameters, casting to their dtype and device.
        self.model.load_state_dict({k: v.detach() for k, v in state_dict.items()}, strict=False, assign=False)

    def close(self) -> None:
        self.model = None

    # ---- generation ------------------------------------------------------------

    def start(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        temperature: float,
        seed: int,
        n: int = 1,
    ) -> TransformersSession:
        return TransformersSession(self, *rows_per_sample(prompts, max_new_tokens, n), temperature, seed)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float, seed: int):
        """`n` completions per prompt (prompt-major), with log mu of each sampled token."""
        return generate_by_steps(self, prompts, n, max_new_tokens, temperature, seed)


class TransformersSession(SteppedSampler):
    """One batch decoded step by step through the model's forward and its KV cache.

    As `TorchSession`: rows are left-padded (masked, with positions counted from each
    row's first real token), each `step` first feeds the previous step's tokens (the
    prompts at the first step) then samples, so weights loaded between two steps take
    effect at the next token and the KV already computed stays."""

    def __init__(
        self,
        backend: TransformersBackend,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        temperature: float,
        seed: int,
    ) -> None:
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        super().__init__(backend, prompts, max_new_tokens, temperature, seed, backend.max_positions)
        self.attention = self.prompt_mask.long()
        self.cache = None
        # Per row, the routers' choices for each token run so far: [tokens, layers, top_k].
        self.routes: list[list[torch.Tensor]] = [[] for _ in prompts]

    @torch.inference_mode()
    def step(self) -> list[StepToken]:
        if bool(self.done.all()):
            return []
        b, t = self.b, self.t
        if t == 0:
            ids, positions = self.ids, (self.attention.cumsum(-1) - 1).clamp(min=0)
        else:
            self.attention = torch.cat([self.attention, torch.ones_like(self.attention[:, :1])], dim=1)
            ids, positions = self.previous_tokens()[:, None], (self.lengths + t - 1)[:, None]
        dev = b.device
        out = b.model(
            input_ids=ids.to(dev),
            attention_mask=self.attention.to(dev),
            position_ids=positions.to(dev),
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        if b.recorder is not None:
            self._keep_routes(b.recorder.take(), ids.shape)
        return self.sample(out.logits[:, -1].float())

    def _keep_routes(self, kept: torch.Tensor, shape: torch.Size) -> None:
        """File one forward's choices ([layers, rows × positions, top_k]) under each row:
        the prompt's real tokens at the first step (left padding dropped), then the token
        each row was fed, while it is a real one."""
        per_row = kept.reshape(kept.shape[0], shape[0], shape[1], kept.shape[-1]).permute(1, 2, 0, 3)
        for row in range(shape[0]):
            if self.t == 0:
                self.routes[row].append(per_row[row][self.prompt_mask[row]])
            elif bool(self.last_real[row]):
                self.routes[row].append(per_row[row])

    def routing(self, row: int):
        if self.b.recorder is None:
            return None

        return RoutingRecord.of(torch.cat(self.routes[row]).numpy(), self.b.recorder.num_experts)

    def close(self) -> None:
        self.done[:] = True
        self.cache = None
