"""Incremental detokenisation: the text each new token adds, as tokens arrive.

A token can end in the middle of a multi-byte character (the decoded text then ends in U+FFFD)
or change how the previous tokens decode (leading-space rules); decoding a short window of recent
tokens and emitting only the new suffix once it is complete handles both. The pieces of a
generation concatenate to the tokenizer's decoding of all its tokens.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Detokenizer"]


class Detokenizer:
    def __init__(self, tokenizer: Any | None, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the window that gives the context
        self._read = 0  # tokens whose text was already emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes ("" while a character is unfinished)."""
        self.ids.append(token_id)
        if self.tokenizer is None:
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before) :]
        return ""
