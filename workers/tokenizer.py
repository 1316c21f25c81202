"""A fixed character-level tokenizer for the synthetic tasks.

No downloads and no training: the vocabulary is three special tokens followed by a
fixed list of printable characters, so ids never depend on the data. It is saved next
to the model as a small JSON file, because vLLM runs with `skip_tokenizer_init` and the
engine decodes token ids itself.
"""

from __future__ import annotations

import json
import os

TOKENIZER_FILE = "rollway_tokenizer.json"

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
# Every character a task may use. Appending keeps old ids valid; reordering breaks
# every cached model, so never reorder.
DEFAULT_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789=+-*/ ,.:?"


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
