"""Tokenizers: the fixed character tokenizer of the tiny default model, and any Hugging
Face tokenizer a model directory carries, behind one small interface (`Tokenizer`).

The char tokenizer needs no downloads and no training: three special tokens followed
by a fixed list of printable characters, so ids never depend on the data. It is saved
next to the model as a small JSON file (`rollway_tokenizer.json`); a directory with that
file is a Rollway char model, any other model directory brings its own tokenizer
(`load_tokenizer`). Inference backends work on token ids; the tokenizer turns a task's
prompt into ids, an answer into training targets, and sampled ids back into text.

transformers is imported only inside the functions that need it: the platform imports
this module (through workers.run.admission) in processes that must stay light.
"""

from __future__ import annotations

import json
import os
from typing import Any, Protocol

from workers.core import chat
from workers.core.char_vocab import DEFAULT_CHARS

TOKENIZER_FILE = "rollway_tokenizer.json"

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


class Tokenizer(Protocol):
    """What the engine needs of a tokenizer."""

    pad_id: int
    eos_id: int  # the id a training target ends with

    @property
    def vocab_size(self) -> int: ...

    @property
    def stop_ids(self) -> list[int]:
        """Every id that ends a completion (the EOS ids of the tokenizer and the model)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of `text` alone: no special tokens added."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of a completion: up to its first stop id, special tokens left out."""
        ...

    def prompt_ids(self, prompt: str, tools: list[dict] | None = None) -> list[int]:
        """Model input for a task prompt (what inference and the warm start both feed);
        `tools`' JSON schemas shown to the model where its chat template renders tools."""
        ...

    def renders_tools(self, tools: list[dict]) -> bool:
        """Whether the chat template shows `tools` and takes their results as `tool`
        messages (else a tool task keeps its own text format)."""
        ...

    def tool_result_ids(self, output: str, tools: list[dict]) -> list[int]:
        """The environment's turn for a tool's `output` in the chat template: the model's
        turn closed, the `tool` message, the assistant's generation prompt."""
        ...

    def save(self, directory: str) -> None: ...


class CharTokenizer:
    """One id per character; pad=0, bos=1, eos=2."""

    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, chars: str = DEFAULT_CHARS) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer chars must not repeat a character")
        self.chars = chars
        self._itos = [PAD, BOS, EOS, *chars]
        self._stoi = {c: i + 3 for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    @property
    def stop_ids(self) -> list[int]:
        return [self.eos_id]

    def encode(self, text: str) -> list[int]:
        """Ids of `text`'s characters (no BOS/EOS added)."""
        try:
            return [self._stoi[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the tokenizer vocabulary {self.chars!r}") from None

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; stops at the first EOS and skips pad/bos."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            out.append(self._itos[i])
        return "".join(out)

    def prompt_ids(self, prompt: str, tools: list[dict] | None = None) -> list[int]:
        """BOS then the prompt's characters (no chat template: `tools` are not shown)."""
        return [self.bos_id, *self.encode(prompt)]

    def renders_tools(self, tools: list[dict]) -> bool:
        return False

    def tool_result_ids(self, output: str, tools: list[dict]) -> list[int]:
        raise ValueError("the char tokenizer has no chat template to render a tool message")

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, TOKENIZER_FILE), "w") as f:
            json.dump(
                {
                    "type": "char",
                    "chars": self.chars,
                    "pad_id": self.pad_id,
                    "bos_id": self.bos_id,
                    "eos_id": self.eos_id,
                },
                f,
            )

    @classmethod
    def load(cls, directory: str) -> CharTokenizer:
        path = os.path.join(directory, TOKENIZER_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} not found: a Rollway model directory carries its tokenizer "
                f"(save one with CharTokenizer().save(dir))"
            )
        with open(path) as f:
            data = json.load(f)
        return cls(data["chars"])

    def to_hf(self):
        """The same vocabulary as a `PreTrainedTokenizerFast` (a WordLevel model over
        single characters), so an exported char model loads with `AutoTokenizer`: its
        `encode` gives BOS + one id per character, exactly `prompt_ids`, and its
        `decode` joins characters without spaces."""
        from tokenizers import Regex, decoders, models, pre_tokenizers, processors
        from tokenizers import Tokenizer as RawTokenizer
        from transformers import PreTrainedTokenizerFast

        vocab = {token: i for i, token in enumerate(self._itos)}
        raw = RawTokenizer(models.WordLevel(vocab, unk_token=PAD))
        raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
        raw.decoder = decoders.Fuse()
        raw.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, self.bos_id)]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=raw,
            pad_token=PAD,
            bos_token=BOS,
            eos_token=EOS,
            clean_up_tokenization_spaces=False,
        )


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def model_eos_ids(model_dir: str) -> list[int]:
    """EOS ids the model's own files name: generation_config.json, then config.json."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        for i in _ids(_json(os.path.join(model_dir, name)).get("eos_token_id")):
            if i not in ids:
                ids.append(i)
    return ids


# A conversation rendered to see how a template writes tool results: an assistant turn
# whose content is a marker no template writes itself, then a tool's answer.
_PROBE_REPLY = "\u2063rollway-reply\u2063"
_PROBE_OUTPUT = "\u2063rollway-tool-output\u2063"
_PROBE_TURNS = [
    {"role": "user", "content": "?"},
    {"role": "assistant", "content": _PROBE_REPLY},
    {"role": "tool", "content": _PROBE_OUTPUT},
]


class HFTokenizer:
    """A Hugging Face tokenizer (`AutoTokenizer`) as the engine uses it.

    Prompts go through the model's chat template where it has one (a user turn, then
    the assistant's generation prompt), else plain text with the tokenizer's own special
    tokens (BOS where it adds one). Generation stops at any EOS id the tokenizer or the
    model's config names; a training target ends with the tokenizer's EOS (the first of
    those). Without a pad token, EOS pads: padded positions are masked everywhere, so
    only the id's range matters."""

    def __init__(self, hf_tokenizer, model_eos: list[int] | None = None) -> None:
        self.hf = hf_tokenizer
        eos = [i for i in [hf_tokenizer.eos_token_id, *(model_eos or [])] if i is not None]
        if not eos:
            raise ValueError(
                "the tokenizer has no eos_token and the model names no eos_token_id: generation could never stop"
            )
        self._stop_ids = list(dict.fromkeys(int(i) for i in eos))
        self.eos_id = self._stop_ids[0]
        pad = hf_tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_id
        self.bos_id = hf_tokenizer.bos_token_id
        self.has_chat_template = bool(getattr(hf_tokenizer, "chat_template", None))
        self._renders_tools: dict[str, bool] = {}

    @classmethod
    def load(cls, model_dir: str) -> HFTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_dir), model_eos_ids(model_dir))

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def stop_ids(self) -> list[int]:
        return list(self._stop_ids)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        stops = set(self._stop_ids)
        cut = next((k for k, i in enumerate(ids) if i in stops), len(ids))
        return self.hf.decode(list(ids[:cut]), skip_special_tokens=True)

    def prompt_ids(self, prompt: str, tools: list[dict] | None = None) -> list[int]:
        """A conversational prompt (workers/core/chat.py) rendered by the chat template; a text
        prompt as a user turn where the model has one, else the text itself. `tools` are
        rendered where the template shows them (`renders_tools`)."""
        messages = chat.messages_of(prompt)
        if messages is not None and not self.has_chat_template:
            raise ValueError(
                "a conversational prompt (role/content messages) needs the model's chat template, and this "
                "tokenizer has none: use a chat model, or give the prompts as text"
            )
        if self.has_chat_template:
            shown = tools if tools and self.renders_tools(tools) else None
            return self.chat_ids(messages if messages is not None else [{"role": "user", "content": prompt}], shown)
        ids = list(self.hf.encode(prompt, add_special_tokens=True))
        # A model's first position must hold something: BOS where the tokenizer did not add it.
        if self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def chat_ids(
        self, messages: list[dict], tools: list[dict] | None = None, generation_prompt: bool = True
    ) -> list[int]:
        """`messages` (and the JSON schemas of `tools`) as the chat template renders them,
        ending with the assistant's generation prompt unless `generation_prompt` is off."""
        ids = self.hf.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )
        return [int(i) for i in ids]

    def _render(self, messages: list[dict], tools: list[dict], generation_prompt: bool) -> str:
        return self.hf.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
        )

    def renders_tools(self, tools: list[dict]) -> bool:
        """Whether the template shows every tool's name and renders a `tool` message's
        content after the assistant's turn (templates that ignore tools, or refuse the
        `tool` role, do not): probed once per set of tools."""
        key = json.dumps(tools, sort_keys=True)
        if key not in self._renders_tools:
            self._renders_tools[key] = self._probe_tools(tools)
        return self._renders_tools[key]

    def _probe_tools(self, tools: list[dict]) -> bool:
        if not self.has_chat_template:
            return False
        try:
            shown = self._render([{"role": "user", "content": "?"}], tools, True)
            turns = self._render(_PROBE_TURNS, tools, True)
        except Exception:  # a template that refuses a role raises its own exception type
            return False
        names = [t.get("function", t).get("name", "") for t in tools]
        after = turns.partition(_PROBE_REPLY)[2]
        return all(n and n in shown for n in names) and _PROBE_OUTPUT in after

    def tool_result_ids(self, output: str, tools: list[dict]) -> list[int]:
        """What the template writes after an assistant turn's content when a `tool`
        message with `output` follows, up to the next assistant generation prompt; as
        ids of this tokenizer (special tokens in it included)."""
        turns = [*_PROBE_TURNS[:2], {"role": "tool", "content": output}]
        text = self._render(turns, tools, True)
        return self.encode(text[text.index(_PROBE_REPLY) + len(_PROBE_REPLY) :])

    def save(self, directory: str) -> None:
        self.hf.save_pretrained(directory)


def load_tokenizer(model_dir: str) -> Tokenizer:
    """The tokenizer a model directory carries: Rollway's char tokenizer where its file is
    there, else the directory's Hugging Face tokenizer."""
    if os.path.exists(os.path.join(model_dir, TOKENIZER_FILE)):
        return CharTokenizer.load(model_dir)
    return HFTokenizer.load(model_dir)
