"""Reference inference in plain torch: a static-KV-cache decoding loop for Llama and Qwen2.

It reads the same Hugging Face directory vLLM does and reimplements the forward the two
share (RMSNorm, rotary embeddings, grouped attention, SwiGLU, with the projections' bias
terms where the checkpoint has them: Qwen2's on q, k and v) on raw tensors. At this model
size Python overhead dominates, and a hand-written loop with a preallocated KV cache and
fused QKV / gate-up projections is faster than `transformers.generate`
(docs/performance.md). Logprobs are of the sampled token under the sampling
distribution, log_softmax(logits / temperature) after the top-k / top-p / min-p cut
(workers/inference/sampling.py), which is what the trainer's importance weights need as
the behaviour policy mu.

Other architectures (anything else AutoModelForCausalLM loads) run on transformers' own
forward instead (`workers.inference.transformers_backend`);
`fast_path_problem` says which a directory gets.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workers.core.sampling_mask import Kept
from workers.inference.base import Completion, StepToken
from workers.inference.sampling import Truncation
from workers.model.loading import checkpoint_weights, dims_of

# The model types whose forward is the one written here (transformers' LlamaForCausalLM
# and Qwen2ForCausalLM: Qwen2 is Llama with biased q, k and v projections).
FAST_PATH_TYPES = ("llama", "qwen2")


def fast_path_problem(cfg: dict) -> str | None:
    """Why the hand-written forward cannot run a model of this config.json, or None."""
    if cfg.get("model_type") not in FAST_PATH_TYPES:
        kinds = " and ".join(FAST_PATH_TYPES)
        return f"TorchBackend runs {kinds} models; this one has model_type {cfg.get('model_type')!r}"
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"TorchBackend supports default RoPE only (got {rope})"
    if cfg.get("use_sliding_window") or "sliding_attention" in (cfg.get("layer_types") or []):
        return "TorchBackend attends to every position; this model uses sliding-window attention"
    if cfg.get("hidden_act", "silu") != "silu":
        return f"TorchBackend runs SwiGLU (silu) only (got {cfg.get('hidden_act')!r})"
    return None


def eos_ids(cfg: dict) -> list[int]:
    """Every id config.json names as EOS (one id or a list); [2] if it names none."""
    eos = cfg.get("eos_token_id")
    if eos is None:
        return [2]
    return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]


class TorchBackend:
    """Batched temperature sampling (then `truncation`: top-k, top-p, min-p) with
    per-token logprobs, seeded, stops at EOS."""

    def __init__(self, model_dir: str, truncation: Truncation | None = None, keep_sampling_mask: bool = False) -> None:
        self.truncation = truncation or Truncation()
        self.keep_sampling_mask = keep_sampling_mask  # record each token's kept set (SteppedSampler)
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        problem = fast_path_problem(cfg)
        if problem:
            raise ValueError(f"{problem} ({model_dir})")
        dims = dims_of(model_dir)
        self.num_layers = dims.layers
        self.num_heads = dims.heads
        self.num_kv_heads = dims.kv_heads
        self.hidden_size = dims.hidden
        self.head_dim = dims.head_dim
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.max_positions = dims.positions
        # A completion ends at any of them (a chat model's end of turn and its EOS).
        self.stop_ids = torch.tensor(eos_ids(cfg), dtype=torch.long)
        self.eos_id = int(self.stop_ids[0])
        self.pad_id = cfg.get("pad_token_id") or 0
        rope = cfg.get("rope_parameters") or {}
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.tie = dims.tied
        self.load_weights(checkpoint_weights(model_dir))

    # ---- weights ---------------------------------------------------------------

    def label_weights(self, version: int) -> None:
        """Nothing to label: weights change only between the calls the caller makes, so
        its own version tags every token exactly."""

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Full reload from checkpoint-format names (model.layers.N.self_attn.q_proj.weight…)."""
        sd = {k: v.detach().to(torch.float32) for k, v in state_dict.items()}
        try:
            self.embed = sd["model.embed_tokens.weight"].clone()
            self.final_norm = sd["model.norm.weight"].clone()
            self.lm_head = (
                sd["model.embed_tokens.weight"] if self.tie and "lm_head.weight" not in sd else sd["lm_head.weight"]
            ).clone()
            layers = []
            for i in range(self.num_layers):
                p = f"model.layers.{i}."
                layers.append(
                    Layer(
                        in_norm=sd[p + "input_layernorm.weight"].clone(),
                        post_norm=sd[p + "post_attention_layernorm.weight"].clone(),
                        # Fused projections: one matmul instead of three (two) per layer.
                        qkv=_fused(sd, p + "self_attn.", ("q_proj", "k_proj", "v_proj")),
                        o=sd[p + "self_attn.o_proj.weight"].t().contiguous(),
                        gate_up=_fused(sd, p + "mlp.", ("gate_proj", "up_proj")),
                        down=sd[p + "mlp.down_proj.weight"].t().contiguous(),
                        # Bias terms, where the checkpoint has them (Qwen2's q, k, v; a Llama's
                        # attention_bias / mlp_bias): None costs nothing in the forward.
                        qkv_b=_bias(sd, p + "self_attn.", ("q_proj", "k_proj", "v_proj")),
                        o_b=_bias(sd, p + "self_attn.", ("o_proj",)),
                        gate_up_b=_bias(sd, p + "mlp.", ("gate_proj", "up_proj")),
                        down_b=_bias(sd, p + "mlp.", ("down_proj",)),
                    )
                )
        except KeyError as exc:
            raise KeyError(
                f"load_weights: missing {exc.args[0]!r}; pass the full state dict under Hugging "
                f"Face checkpoint names (Trainer.state_dict())"
            ) from None
        self.layers: list[Layer] = layers
        self.lm_head_t = self.lm_head.t().contiguous()

    def close(self) -> None:
        self.layers = []

    # ---- forward ---------------------------------------------------------------

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, hd)
        return emb.cos(), emb.sin()

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _forward(self, ids, positions, start, mask, k_cache, v_cache) -> torch.Tensor:
        """Run tokens `ids` (B, T) at cache slots start..start+T; returns last hidden (B, D)."""
        B, T = ids.shape
        H, KV, hd = self.num_heads, self.num_kv_heads, self.head_dim
        end = start + T
        x = self.embed[ids]
        cos, sin = self._rope(positions)
        for li, L in enumerate(self.layers):
            h = self._rms(x, L.in_norm)
            q, k, v = _linear(h, L.qkv, L.qkv_b).split([H * hd, KV * hd, KV * hd], dim=-1)
            q = self._rotate(q.view(B, T, H, hd).transpose(1, 2), cos, sin)
            k = self._rotate(k.view(B, T, KV, hd).transpose(1, 2), cos, sin)
            k_cache[li][:, :, start:end] = k
            v_cache[li][:, :, start:end] = v.view(B, T, KV, hd).transpose(1, 2)
            att = F.scaled_dot_product_attention(
                q,
                k_cache[li][:, :, :end],
                v_cache[li][:, :, :end],
                attn_mask=mask,
                enable_gqa=KV != H,
            )
            x = x + _linear(att.transpose(1, 2).reshape(B, T, H * hd), L.o, L.o_b)
            gate, up = _linear(self._rms(x, L.post_norm), L.gate_up, L.gate_up_b).chunk(2, dim=-1)
            x = x + _linear(F.silu(gate) * up, L.down, L.down_b)
        return self._rms(x[:, -1], self.final_norm)

    # ---- generation ------------------------------------------------------------

    def start(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        temperature: float,
        seed: int,
        n: int = 1,
    ) -> TorchSession:
        """A stepped generation, `n` rows per prompt (see `DecodeSession`)."""
        return TorchSession(self, *rows_per_sample(prompts, max_new_tokens, n), temperature, seed, samples=n)

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]:
        """`n` completions per prompt (prompt-major), with log mu of each sampled token."""
        return generate_by_steps(self, prompts, n, max_new_tokens, temperature, seed)


@dataclass
class Layer:
    """One decoder layer's weights, the projections fused and transposed (`x @ w + b`)."""

    in_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    qkv_b: torch.Tensor | None
    o_b: torch.Tensor | None
    gate_up_b: torch.Tensor | None
    down_b: torch.Tensor | None


def _fused(sd: dict[str, torch.Tensor], prefix: str, projections: tuple[str, ...]) -> torch.Tensor:
    """`projections`' weights stacked (in order) and transposed for `x @ w`."""
    return torch.cat([sd[f"{prefix}{name}.weight"] for name in projections]).t().contiguous()


def _bias(sd: dict[str, torch.Tensor], prefix: str, projections: tuple[str, ...]) -> torch.Tensor | None:
    """The fused bias of `projections` (in order), None if the checkpoint has none; a
    checkpoint with some of them but not all is refused naming the one missing."""
    names = [f"{prefix}{name}.bias" for name in projections]
    found = [sd.get(name) for name in names]
    if all(b is None for b in found):
        return None
    for name, b in zip(names, found, strict=True):
        if b is None:
            raise KeyError(name)
    return torch.cat([b for b in found if b is not None]).clone()


def _linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight_t (+ bias): the projections with their weights stored transposed."""
    return x @ weight_t if bias is None else torch.addmm(bias, x.flatten(0, -2), weight_t).view(*x.shape[:-1], -1)


def generate_by_steps(
    backend, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float, seed: int
) -> list[list[Completion]]:
    """`generate` as a stepped session run to the end: `n` completions per prompt."""
    if not prompts:
        return []
    rows = [p for p in prompts for _ in range(n)]
    session = backend.start(prompts, [max_new_tokens] * len(prompts), temperature, seed, n=n)
    tokens: list[list[int]] = [[] for _ in rows]
    logprobs: list[list[float]] = [[] for _ in rows]
    kept: list[list] = [[] for _ in rows]
    finish: list[str] = ["length"] * len(rows)
    while session.unfinished():
        for st in session.step():
            tokens[st.row].append(st.token)
            logprobs[st.row].append(st.logprob)
            kept[st.row].append(st.kept)
            if st.finish_reason is not None:
                finish[st.row] = st.finish_reason
    out: list[list[Completion]] = []
    for i in range(len(rows)):
        if i % n == 0:
            out.append([])
        out[-1].append(Completion(tokens[i], logprobs[i], finish[i], session.routing(i), kept[i]))
    session.close()
    return out


def rows_per_sample(prompts: list[list[int]], max_new_tokens: list[int], n: int) -> tuple[list[list[int]], list[int]]:
    """Each prompt and its budget `n` times, prompt-major: row i·n + j is sample j of
    prompt i (a stepped session's rows)."""
    if len(max_new_tokens) != len(prompts):
        raise ValueError("max_new_tokens needs one budget per prompt")
    return [p for p in prompts for _ in range(n)], [b for b in max_new_tokens for _ in range(n)]


def draw(logp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row (rows × 1) from the distribution whose log-probabilities are
    `logp`, by inverse transform sampling: one uniform draw per row against the row's
    cumulative probabilities. Not `torch.multinomial`: on the CPU it draws an exponential
    for every vocabulary entry of every row (the exponential race), which was 377 of the
    387 µs a step's sampling took for 64 rows of a 261-token vocabulary (1 thread), about a
    tenth of a tiny model's decode step; this takes 58 µs. In float64, so that the uniform's
    resolution is far below any probability a row can give a token; a draw that rounds up to
    the row's total takes the last token with mass, never one a filter removed."""
    cdf = logp.exp().double().cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(cdf.shape[0], 1, generator=gen, dtype=torch.float64, device=cdf.device) * total
    tok = torch.searchsorted(cdf, u, right=True)
    return torch.minimum(tok, (cdf < total).sum(-1, keepdim=True))


class SteppedSampler:
    """What the stepped torch sessions share: the prompts left-padded to one length
    (`ids`, `prompt_mask`), each row's token budget, and `sample`, which draws every
    unfinished row's next token from its logits (seeded, temperature, then the backend's
    `truncation`), records its
    logprob and ends a row at a stop id or at its budget. A session's `step` runs the
    model and hands its last-position logits to `sample`."""

    def __init__(
        self,
        backend,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        temperature: float,
        seed: int,
        max_positions: int | None,
    ) -> None:
        if len(max_new_tokens) != len(prompts) or min(max_new_tokens, default=1) < 1:
            raise ValueError("max_new_tokens needs one budget ≥ 1 per prompt")
        self.b = backend
        self.temperature = temperature
        self.truncation: Truncation = getattr(backend, "truncation", None) or Truncation()
        # Keep Sampling Mask: each token's kept set, when the backend is asked to and the
        # filters cut anything.
        self.keep_mask = bool(getattr(backend, "keep_sampling_mask", False)) and self.truncation.active
        B = len(prompts)
        self.P = P = max((len(p) for p in prompts), default=1)
        self.S = P + max(max_new_tokens, default=1)
        if max_positions is not None and max_positions < self.S:
            raise ValueError(
                f"prompt ({P} tokens) + max_new_tokens ({self.S - P}) exceeds the model's "
                f"max_position_embeddings ({max_positions})"
            )
        self.budget = torch.tensor(max_new_tokens, dtype=torch.long)
        self.lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        self.ids = torch.full((B, P), backend.pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            self.ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        self.prompt_mask = torch.arange(P)[None, :] >= (P - self.lengths)[:, None]
        # Draws happen where the logits are (a GPU backend's device): moving a 150k-wide
        # row per sequence to the CPU each step would cost more than the forward.
        self.gen = torch.Generator(device=getattr(backend, "device", "cpu")).manual_seed(seed)
        self.done = torch.zeros(B, dtype=torch.bool)
        self.t = 0  # tokens sampled per row so far
        self.last: torch.Tensor | None = None
        # Rows whose `last` token is a real one (the row was generating when it was drawn).
        self.last_real = torch.zeros(B, dtype=torch.bool)

    def unfinished(self) -> list[int]:
        return (~self.done).nonzero().flatten().tolist()

    def routing(self, row: int):
        """None: this session records no expert routing (a dense model, or recording off)."""
        return None

    def sample(self, logits: torch.Tensor) -> list[StepToken]:
        """Each unfinished row's next token from `logits` (rows × vocab), and the step's
        bookkeeping: a finished row samples too (one generator stream whatever ends when)
        but gets pad and reports nothing."""
        b, t = self.b, self.t
        cut = self.truncation(logits / self.temperature)
        logp = torch.log_softmax(cut, dim=-1)
        tok = draw(logp, self.gen)
        lp = logp.gather(1, tok).squeeze(1).cpu()
        tok = torch.where(self.done, torch.full_like(self.done, b.pad_id, dtype=torch.long), tok.squeeze(1).cpu())
        hit_eos = torch.isin(tok, b.stop_ids) & ~self.done
        spent = (self.budget <= t + 1) & ~self.done & ~hit_eos
        kept = self._kept(cut)
        out = [
            StepToken(row, token, logprob, "stop" if eos else "length" if length else None, kept[row])
            for row, (token, logprob, eos, length, was_done) in enumerate(
                zip(tok.tolist(), lp.tolist(), hit_eos.tolist(), spent.tolist(), self.done.tolist(), strict=True)
            )
            if not was_done
        ]
        self.last_real = ~self.done
        self.done |= hit_eos | spent
        self.last = tok
        self.t += 1
        return out

    def _kept(self, cut: torch.Tensor) -> list:
        """Each row's kept set (the ids the filters left finite), or None per row when
        not recording."""
        if not self.keep_mask:
            return [None] * cut.shape[0]

        finite = torch.isfinite(cut).cpu()
        vocab = cut.shape[-1]
        return [
            None if bool(d) else Kept(row.nonzero().flatten().numpy(), vocab)
            for row, d in zip(finite, self.done, strict=True)
        ]

    def previous_tokens(self) -> torch.Tensor:
        """The tokens the previous step sampled, one per row (pad for a finished row):
        what the next step runs through the model."""
        if self.last is None:
            raise RuntimeError("no step has sampled yet")
        return self.last


class TorchSession(SteppedSampler):
    """One batch decoded step by step on a TorchBackend's static KV cache.

    Each `step` first runs the tokens sampled at the previous step through the model
    (the prompts, at the first step), then samples: so a token's logits come wholly from
    the weights loaded at its step, and weights loaded between two steps take effect at
    the next token (the KV of earlier positions stays as computed). Rows are left-padded
    so every row's next token lands in the same cache slot; row i stops at EOS or after
    `max_new_tokens[i]` tokens.

    `samples`: rows come in runs of that many samples of one prompt (`rows_per_sample`'s
    order). The first step then runs each prompt once and copies its KV to its samples'
    rows: at a group size of 8 the prefill was most of a step's cost for 8× the work.
    """

    def __init__(
        self,
        backend: TorchBackend,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        temperature: float,
        seed: int,
        samples: int = 1,
    ) -> None:
        super().__init__(backend, prompts, max_new_tokens, temperature, seed, backend.max_positions)
        if samples < 1 or len(prompts) % samples:
            raise ValueError(f"{len(prompts)} rows are not runs of {samples} samples of a prompt")
        self.samples = samples
        B, P, S = len(prompts), self.P, self.S
        self.valid = torch.zeros((B, S), dtype=torch.bool)
        self.valid[:, :P] = self.prompt_mask
        self.positions = (self.valid[:, :P].long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(P, P, dtype=torch.bool).tril()
        # A pad query may see itself, so no attention row is empty (an empty row is NaN,
        # and NaN in a masked value still poisons the real rows through 0 * NaN).
        self.mask = (causal & self.valid[:, None, :P]) | torch.eye(P, dtype=torch.bool)
        kv = (B, backend.num_kv_heads, S, backend.head_dim)
        self.k_cache = [torch.empty(kv) for _ in backend.layers]
        self.v_cache = [torch.empty(kv) for _ in backend.layers]

    @torch.inference_mode()
    def step(self) -> list[StepToken]:
        if bool(self.done.all()):
            return []
        b, P, t = self.b, self.P, self.t
        if t == 0:
            hidden = self._prefill()
        else:
            self.valid[:, P + t - 1] = True
            hidden = b._forward(
                self.previous_tokens()[:, None],
                (self.lengths + t - 1)[:, None],
                P + t - 1,
                self.valid[:, None, None, : P + t],
                self.k_cache,
                self.v_cache,
            )
        return self.sample(hidden @ b.lm_head_t)

    def _prefill(self) -> torch.Tensor:
        """The prompts through the model, each once: its first sample's row is computed
        (strided views of the caches), then copied to the other samples' rows."""
        b, n, P = self.b, self.samples, self.P
        if n == 1:
            return b._forward(self.ids, self.positions, 0, self.mask[:, None], self.k_cache, self.v_cache)
        firsts = slice(None, None, n)
        hidden = b._forward(
            self.ids[firsts],
            self.positions[firsts],
            0,
            self.mask[firsts, None],
            [k[firsts] for k in self.k_cache],
            [v[firsts] for v in self.v_cache],
        )
        for cache in (*self.k_cache, *self.v_cache):
            runs = cache.view(-1, n, *cache.shape[1:])  # (prompts, samples, heads, slots, dim)
            runs[:, 1:, :, :P] = runs[:, :1, :, :P]
        return hidden.repeat_interleave(n, dim=0)

    def close(self) -> None:
        self.done[:] = True
        self.k_cache, self.v_cache = [], []
