"""Multi-turn episodes (workers/rollout/episodes.py) with a scripted fake policy: tool calls are
executed and their results appended as masked tokens, limits end episodes, and each
turn carries the version of the weights that generated it.

The fake backend writes, one token per decode step, a script chosen per test (by
default the correct episode "calc:<expr>?" "=<value> " "<value>" then EOS), but only the
model's parts: it emits the script's next token where the completion so far agrees
with it, and "z" after a call within the same session (those tokens must be dropped:
the turn ended at the "?"). Its logprob tells which weights produced a token: -0.5
under version 0, -0.25 under version 1, -0.125 under version 2. The same script runs
through a byte-level BPE Hugging Face tokenizer, whose tokens span several characters.
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import small_config
from workers.inference.base import StepToken
from workers.inference.torch_backend import generate_by_steps
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks.reverse import ReverseTask
from workers.rl_tasks.tool_task import CalculatorTask
from workers.rl_tasks.tools import calculate
from workers.rollout.episodes import TOOL_LOGPROB, Episode, episode_text, run_episodes
from workers.rollout.generation import generate, generate_groups
from workers.rollout.partial_rollouts import UpdatePolicy

TOK = CharTokenizer()


def correct(expression: str) -> list[str]:
    value = calculate(expression)
    return [f"calc:{expression}?", f"={value} ", value]


class ScriptedBackend:
    """An InferenceBackend whose policy follows `script(expression) -> turns` (model and
    tool turns alternating, the model's first; EOS after the last), token by token in
    `tokenizer`'s ids: each piece encoded on its own, as the episode loop encodes a
    tool's result."""

    def __init__(self, script=correct, tokenizer=TOK, prompts=("12*7+3=", "2-9="), tools=None) -> None:
        self.script = script
        self.tok = tokenizer
        self.prompts = {tuple(tokenizer.prompt_ids(p, tools)): p[:-1] for p in prompts}
        self.junk = tokenizer.encode("z")[0]
        self.call_end = tokenizer.encode("?")[-1]
        self.version = 0
        self.sessions: list[ScriptedSession] = []

    def target(self, context: list[int]) -> tuple[int, list[int]]:
        """(prompt length, the scripted completion's ids) for a row's context."""
        for prompt, expression in self.prompts.items():
            if tuple(context[: len(prompt)]) == prompt:
                ids = [t for piece in self.script(expression) for t in self.tok.encode(piece)]
                return len(prompt), [*ids, self.tok.eos_id]
        raise AssertionError(f"no scripted prompt starts {context}")

    def start(self, prompts, max_new_tokens, temperature, seed, n=1):
        rows = [list(p) for p in prompts for _ in range(n)]
        budgets = [b for b in max_new_tokens for _ in range(n)]
        session = ScriptedSession(self, rows, budgets)
        self.sessions.append(session)
        return session

    def generate(self, prompts, n, max_new_tokens, temperature, seed):
        return generate_by_steps(self, prompts, n, max_new_tokens, temperature, seed)


class ScriptedSession:
    def __init__(self, backend: ScriptedBackend, contexts: list[list[int]], budgets: list[int]) -> None:
        self.b = backend
        self.contexts = contexts
        self.budgets = budgets
        self.new: list[list[int]] = [[] for _ in contexts]
        self.done = [False] * len(contexts)
        self.closed = False
        self.steps = 0

    def _next(self, row: int) -> int:
        if any("?" in self.b.tok.decode([t]) for t in self.new[row]):
            return self.b.junk  # after a call, in the same session: must be dropped
        start, target = self.b.target(self.contexts[row])
        completion = self.contexts[row][start:] + self.new[row]
        if target[: len(completion)] == completion and len(completion) < len(target):
            return target[len(completion)]
        return self.b.junk

    def step(self) -> list[StepToken]:
        self.steps += 1
        out = []
        for row in self.unfinished():
            token = self._next(row)
            self.new[row].append(token)
            eos = token == self.b.tok.eos_id
            reason = "stop" if eos else "length" if len(self.new[row]) >= self.budgets[row] else None
            self.done[row] = reason is not None
            out.append(StepToken(row, token, -(0.5 ** (self.b.version + 1)), reason))
        return out

    def unfinished(self) -> list[int]:
        return [] if self.closed else [r for r, d in enumerate(self.done) if not d]

    def routing(self, row: int) -> None:
        return None  # a dense model's

    def close(self) -> None:
        self.closed = True


class Updates:
    """Weights that become pending when `when(backend)` says; each apply loads the next
    version."""

    def __init__(self, backend: ScriptedBackend, when) -> None:
        self.b = backend
        self.when = when
        self.applied = 0

    def pending(self) -> bool:
        return self.when(self.b, self.applied)

    def apply(self) -> int:
        self.applied += 1
        self.b.version += 1
        return self.b.version


def episodes(backend, prompts=("12*7+3=",), n=2, max_new_tokens=40, task=None, **kw) -> list[Episode]:
    task = task or CalculatorTask()
    gen = run_episodes(
        backend, task, TOK, [TOK.prompt_ids(p) for p in prompts], n, max_new_tokens, 1.0, 0, kw.pop("version", 0), **kw
    )
    assert len(gen.sequences) == len(prompts) and all(len(g) == n for g in gen.sequences)
    return [e for g in gen.sequences for e in g]


def segments(e: Episode) -> list[tuple[str, int]]:
    """The episode as (text, mask) runs, EOS shown as "$"."""
    out: list[tuple[str, int]] = []
    for token, m in zip(e.token_ids, e.loss_mask, strict=True):
        ch = "$" if token == TOK.eos_id else TOK.decode([token])
        if out and out[-1][1] == m:
            out[-1] = (out[-1][0] + ch, m)
        else:
            out.append((ch, m))
    return out


def test_a_tool_call_is_run_and_its_result_appended_as_masked_tokens():
    backend = ScriptedBackend()
    for e in episodes(backend, prompts=("12*7+3=", "2-9="), n=2):
        expression = TOK.decode(e.prompt_ids)[:-1]
        value = calculate(expression)
        assert segments(e) == [(f"calc:{expression}?", 1), (f"={value} ", 0), (f"{value}$", 1)]
        assert e.finish_reason == "stop" and e.turns == 2 and e.tool_calls == 1
        assert len(e.token_ids) == len(e.logprobs) == len(e.versions) == len(e.loss_mask)
        # Tool tokens carry the placeholder; the model's carry what the policy reported.
        assert [lp for lp, m in zip(e.logprobs, e.loss_mask, strict=True) if not m] == [TOOL_LOGPROB] * len(
            f"={value} "
        )
        assert {lp for lp, m in zip(e.logprobs, e.loss_mask, strict=True) if m} == {-0.5}
        assert "z" not in TOK.decode(e.token_ids)  # what a row sampled after its call was dropped
    # One session per turn.
    assert len(backend.sessions) == 2


def test_a_malformed_call_gets_the_tools_message_and_the_episode_goes_on():
    backend = ScriptedBackend(lambda expression: ["calc:12*?", "=error: not a valid expression ", "87"])
    (e,) = episodes(backend, n=1, max_new_tokens=60)
    assert segments(e) == [("calc:12*?", 1), ("=error: not a valid expression ", 0), ("87$", 1)]
    assert CalculatorTask().reward(TOK.decode(e.token_ids), "87") == 1.0


def test_the_turn_limit_ends_an_episode_that_keeps_calling():
    always_calls = ["calc:1+1?", "=2 ", "calc:2+2?", "=4 ", "calc:4+4?", "=8 ", "calc:8+8?", "=16 ", "16"]
    backend = ScriptedBackend(lambda expression: always_calls)
    (e,) = episodes(backend, n=1, task=CalculatorTask(max_turns=3), max_new_tokens=200)
    assert segments(e) == [("calc:1+1?", 1), ("=2 ", 0), ("calc:2+2?", 1), ("=4 ", 0), ("calc:4+4?", 1)]
    assert e.turns == 3 and e.tool_calls == 2 and e.finish_reason == "length"
    assert CalculatorTask().reward(TOK.decode(e.token_ids), "16") == 0.0


def test_the_token_budget_counts_tool_tokens_and_can_cut_a_tool_result():
    # "calc:12*7+3?" is 12 tokens; a budget of 14 leaves room for "=8" of "=87 ".
    (e,) = episodes(ScriptedBackend(), n=1, max_new_tokens=14)
    assert segments(e) == [("calc:12*7+3?", 1), ("=8", 0)]
    assert e.finish_reason == "length" and len(e.token_ids) == 14
    # A budget spent inside the first turn: no call, no tool.
    (e,) = episodes(ScriptedBackend(), n=1, max_new_tokens=5)
    assert segments(e) == [("calc:", 1)] and e.finish_reason == "length"


def test_a_turn_generated_before_an_update_keeps_its_version():
    """Weights staged while turn 1 runs are loaded between the turns (abort_resume and
    in_flight alike: nothing is generating then): turn 1 and its tool result carry
    version 0, turn 2 version 1 with the new weights' logprobs."""
    for mode in ("abort_resume", "in_flight", "abort_retry"):
        backend = ScriptedBackend()
        # Pending once the first turn's session is closed, i.e. between turns 1 and 2.
        updates = Updates(backend, lambda b, applied: applied == 0 and b.sessions[0].closed)
        gen = run_episodes(
            backend, CalculatorTask(), TOK, [TOK.prompt_ids("12*7+3=")], 2, 40, 1.0, 0, 0, UpdatePolicy(mode), updates
        )
        assert gen.version == 1 and gen.counts.mid_generation_updates == 1
        assert gen.counts.aborted == gen.counts.retried == gen.counts.resumed == 0
        for e in gen.sequences[0]:
            assert segments(e) == [("calc:12*7+3?", 1), ("=87 ", 0), ("87$", 1)], mode
            call, result, answer = len("calc:12*7+3?"), len("=87 "), len("87") + 1
            assert e.versions == [0] * call + [0] * result + [1] * answer, mode
            assert e.logprobs[:call] == [-0.5] * call and e.logprobs[-answer:] == [-0.25] * answer


def test_an_update_inside_a_later_turn_follows_the_mode():
    """Weights staged after the 2nd step of turn 2: in_flight tags that turn's later
    tokens with version 1; abort_retry regenerates turn 2 alone (turn 1 and its tool
    result are kept, at version 0)."""

    def in_turn_two(b, applied):
        return applied == 0 and len(b.sessions) == 2 and b.sessions[1].steps == 2

    answer = "87" + "$"
    for mode, expected in [
        ("in_flight", [0, 0, 1]),  # "8" "7" under version 0, EOS under 1
        ("abort_resume", [0, 0, 1]),
        ("abort_retry", [1, 1, 1]),
    ]:
        backend = ScriptedBackend()
        updates = Updates(backend, in_turn_two)
        gen = run_episodes(
            backend, CalculatorTask(), TOK, [TOK.prompt_ids("12*7+3=")], 1, 40, 1.0, 0, 0, UpdatePolicy(mode), updates
        )
        (e,) = gen.sequences[0]
        assert segments(e) == [("calc:12*7+3?", 1), ("=87 ", 0), (answer, 1)], mode
        assert e.versions[-len(answer) :] == expected, mode
        assert set(e.versions[: -len(answer)]) == {0}, mode
        if mode == "abort_retry":
            assert gen.counts.retried == 1 and len(backend.sessions) == 3


def test_generation_builds_multi_turn_rollouts_and_leaves_single_turn_ones_unmasked():
    cfg = small_config(inference={"max_new_tokens": 40}, trainer={"group_size": 2})
    prompts = [("12*7+3=", "87"), ("2-9=", "-7")]
    groups = generate_groups(ScriptedBackend(), CalculatorTask(), TOK, prompts, cfg, 3, seed=7)
    for g in groups:
        for r in g.rollouts:
            assert r.reward == 1.0 and r.finish_reason == "stop"
            assert r.loss_mask is not None and 0 in r.loss_mask
            assert r.trained == [bool(m) for m in r.loss_mask]
            assert set(r.token_versions) == {3} and r.min_version == 3

    backend = ScriptedBackend()
    updates = Updates(backend, lambda b, applied: applied == 0 and b.sessions[0].closed)
    cfg = small_config(inference={"max_new_tokens": 40}, trainer={"group_size": 2}, sync={"update_mode": "in_flight"})
    out = generate(backend, CalculatorTask(), TOK, prompts, cfg, 0, 7, UpdatePolicy.of(cfg), updates)
    groups, version, counts = out.groups, out.version, out.counts
    assert version == 1 and counts.mid_generation_updates == 1
    for r in (r for g in groups for r in g.rollouts):
        assert r.min_version == 0 and set(r.model_versions) == {0, 1}

    # A single-turn task: no mask (every token trained), as before.
    reverse = ReverseTask(small_config().task)
    backend = ScriptedBackend(lambda expression: ["cba"], prompts=("abc=",))
    single = generate_groups(backend, reverse, TOK, [("abc=", "cba")], small_config(), 0, seed=1)
    assert [r.reward for r in single[0].rollouts] == [1.0] * 4
    assert all(r.loss_mask is None and all(r.trained) for r in single[0].rollouts)


def test_tool_tokens_do_not_count_in_staleness():
    """A tool token's version never lowers a rollout's min_version (what the buffer
    judges staleness on), whatever it holds."""
    from workers.core.records import Rollout

    r = Rollout([1], [5, 6, 7, 8], [-1.0, 0.0, 0.0, -1.0], [4, 0, 0, 4], "stop", loss_mask=[1, 0, 0, 1])
    assert r.min_version == 4 and r.model_versions == [4, 4]
    with pytest.raises(ValueError, match="loss_mask"):
        Rollout([1], [5, 6], [-1.0, -1.0], [0, 0], "stop", loss_mask=[1])


def bpe_tokenizer(chat_template: str):
    """A byte-level BPE tokenizer with `chat_template`, its merges learnt from the task's
    own episodes, so calls and results span merged tokens."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from workers.model.tokenizer import HFTokenizer

    task = CalculatorTask()
    lines = [p + task.demonstration(p, a) for p, a in task.sample(500, random.Random(0))]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    special = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>"]
    raw.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = chat_template
    return HFTokenizer(fast)


def test_episodes_with_a_hugging_face_tokenizer():
    """The same episodes through a byte-level BPE tokenizer with a chat template that
    shows no tools: calls are found in multi-character tokens, the tool's result is
    encoded by that tokenizer in the task's text format, and the reward reads the
    decoded text."""
    from workers.model.tiny_hf import CHAT_TEMPLATE

    hf = bpe_tokenizer(CHAT_TEMPLATE)
    assert not hf.renders_tools(CalculatorTask.tools)  # so the text format, as before
    prompts = [("12*7+3=", "87"), ("2-9=", "-7")]
    backend = ScriptedBackend(tokenizer=hf, prompts=[p for p, _ in prompts])
    assert any(len(hf.decode([t])) > 1 for p in correct("12*7+3") for t in hf.encode(p))  # merges exist
    cfg = small_config(inference={"max_new_tokens": 40}, trainer={"group_size": 2})
    groups = generate_groups(backend, CalculatorTask(), hf, prompts, cfg, 0, seed=3)
    for g in groups:
        expression, value = g.prompt[:-1], g.answer
        for r in g.rollouts:
            call, result, answer = (hf.encode(piece) for piece in correct(expression))
            assert r.completion_ids == [*call, *result, *answer, hf.eos_id]
            assert r.loss_mask == [1] * len(call) + [0] * len(result) + [1] * (len(answer) + 1)
            assert hf.decode(r.completion_ids) == f"calc:{expression}?={value} {value}"
            assert r.reward == 1.0


# ChatML with tools, as tool-using chat models' templates write them: the schemas in a
# system turn, every role's turn the same way (the tool's result in a `tool` turn).
TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|im_start|>system\nTools: "
    "{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}\n"
    "{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def json_call(expression: str) -> list[str]:
    """The correct episode in the chat format: a JSON call in the model's turn, which it
    closes itself (<|im_end|>, its EOS), the template's tool turn, then the value."""
    value = calculate(expression)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expression + '"}}\n</tool_call>'
    return [call + "<|im_end|>", f"\n<|im_start|>tool\n{value}<|im_end|>\n<|im_start|>assistant\n", value]


def test_a_template_that_renders_tools_gets_the_schema_and_tool_messages():
    """With a chat template that shows tools, the prompt carries the calculator's JSON
    schema, the model's turn holding a JSON call ends at its own end-of-turn token, and
    the result comes back as a `tool` turn of that template (masked, the end-of-turn not
    repeated), after which the model's answer is scored."""
    from workers.rl_tasks.tool_task import TOOLS, final_answer

    hf = bpe_tokenizer(TOOLS_TEMPLATE)
    assert hf.renders_tools(TOOLS)
    prompt_text = hf.hf.decode(hf.prompt_ids("12*7+3=", TOOLS))
    assert "Tools: calculator" in prompt_text and '"expression"' in prompt_text
    assert hf.prompt_ids("12*7+3=") != hf.prompt_ids("12*7+3=", TOOLS)
    prompts = [("12*7+3=", "87"), ("2-9=", "-7")]
    backend = ScriptedBackend(json_call, tokenizer=hf, prompts=[p for p, _ in prompts], tools=TOOLS)
    cfg = small_config(
        model={"max_position_embeddings": 256}, inference={"max_new_tokens": 120}, trainer={"group_size": 2}
    )
    groups = generate_groups(backend, CalculatorTask(), hf, prompts, cfg, 0, seed=3)
    for g in groups:
        expression, value = g.prompt[:-1], g.answer
        for r in g.rollouts:
            assert r.prompt_ids == hf.prompt_ids(g.prompt, TOOLS)
            call, result, answer = (hf.encode(piece) for piece in json_call(expression))
            assert r.completion_ids == [*call, *result, *answer, hf.eos_id]
            assert r.loss_mask == [1] * len(call) + [0] * len(result) + [1] * (len(answer) + 1)
            assert final_answer(episode_text(hf, r.completion_ids, r.loss_mask)) == value
            assert r.reward == 1.0


# Qwen2.5's way with tools, shortened: the schemas in the system turn, a tool's result in a
# user turn inside <tool_response> tags (consecutive results share one turn).
QWEN_STYLE_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# A template that knows no tool role: it refuses one, as some templates do.
NO_TOOL_ROLE_TEMPLATE = (
    "{% for message in messages %}{% if message.role == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_tool_turn_is_what_the_template_writes_between_the_reply_and_the_next_prompt():
    from workers.rl_tasks.tool_task import TOOLS
    from workers.rollout.episodes import tool_turn_ids

    qwen_style = bpe_tokenizer(QWEN_STYLE_TOOLS_TEMPLATE)
    assert qwen_style.renders_tools(TOOLS)
    turn = tool_turn_ids(CalculatorTask(), qwen_style, "12*7+3")
    # The model's own <|im_end|> closed its turn: the tool turn starts after it.
    assert turn == qwen_style.encode(
        "\n<|im_start|>user\n<tool_response>\n87\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # A template that refuses the tool role, or shows no tools, keeps the text format.
    refusing = bpe_tokenizer(NO_TOOL_ROLE_TEMPLATE)
    assert not refusing.renders_tools(TOOLS)
    assert tool_turn_ids(CalculatorTask(), refusing, "12*7+3") == refusing.encode("=87 ")
