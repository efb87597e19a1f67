"""What the page says when something is wrong, and the checks of a request's values.

Terms
-----
input error     a bad value from the page or the API (empty prompt, a number out of range, an
                unknown rule): an ``InputError``, shown as a message; nothing runs.
public message  one short line for the page: the error's first line, file paths replaced by
                ``<path>``, a trailing ``[library detail]`` dropped; never a traceback (that goes
                to the server log). ``fail(exc)`` logs and returns it.
request         the values every run takes besides the rule: prompt, temperature, K, max new
                tokens, seed (``Request``), checked against the server's limits (``Settings``).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

import gradio as gr

from ears_core.pair import is_out_of_memory
from ears_core.rules import RULES, RuleSpec, rule_spec
from ears_core.serve.session import MAX_K

LOG = logging.getLogger("ears_studio")

# A file path: two or more /segments not glued to a word or a slash (hub ids "org/name" and URLs survive).
_PATH = re.compile(r"(?<![\w/.~])(?:~|\.{1,2})?(?:/[^\s/'\"`\[\](),;:]+){2,}/?")


class InputError(ValueError):
    """A bad value from the page or the API; shown as a message, never raised to the client."""


def public_error(exc: BaseException) -> str:
    """The page's line for ``exc`` (see the module's terms)."""
    if is_out_of_memory(exc):
        return ("Out of memory: this pair or request does not fit on this machine. Pick a smaller pair, "
                "or lower max new tokens.")
    text = str(exc).strip().splitlines()[0].strip() if str(exc).strip() else ""
    text = re.sub(r"\s*\[[^\[\]]*\]$", "", text)
    text = _PATH.sub("<path>", text)
    if not text:
        text = f"Something went wrong ({type(exc).__name__}); the server log has the details."
    return text[:400] + ("…" if len(text) > 400 else "")


def public_name(name: str) -> str:
    """A model name for the page: a local folder shows as its last part, never a full path."""
    return _PATH.sub(lambda m: os.path.basename(m.group(0).rstrip("/")), name)


def message(text: str) -> str:
    """A warning toast, and the text for the page's message line."""
    gr.Warning(text)
    return f"⚠️ {text}"


def fail(exc: BaseException) -> str:
    """Log ``exc`` (with its traceback when unexpected); return the page's message for it."""
    if isinstance(exc, ValueError):  # bad input, a model that cannot load: the message says it all
        LOG.info("request refused: %s", exc)
    else:
        LOG.warning("request failed", exc_info=exc)
    return message(public_error(exc))


def timeout_note(limit_s: float) -> str:
    return (f"Stopped after {limit_s:g} s: this server allows {limit_s:g} s of decoding per request. "
            "Lower max new tokens, or run the app yourself.")


@dataclass(frozen=True)
class Request:
    prompt: str
    temperature: float
    k: int
    max_new: int
    seed: int


def _number(name: str, value: Any, lo: float, hi: float, whole: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number, got {value!r}.") from None
    if not lo <= x <= hi:  # NaN fails too
        raise InputError(f"{name} must be between {lo:g} and {hi:g}, got {value!r}.")
    if whole and x != int(x):
        raise InputError(f"{name} must be a whole number, got {value!r}.")
    return x


def check_request(prompt: Any, temperature: Any, k: Any, max_new: Any, seed: Any, *,
                  max_new_tokens: int = 512, max_prompt_chars: int = 4000) -> Request:
    """The request's values, checked (values reach a callback unvalidated from a direct call)."""
    if not prompt or not str(prompt).strip():
        raise InputError("The prompt is empty: type something or pick an example.")
    if len(str(prompt)) > max_prompt_chars:
        raise InputError(f"The prompt has {len(str(prompt))} characters; this server accepts at most "
                         f"{max_prompt_chars}. Shorten it.")
    return Request(str(prompt), _number("temperature", temperature, 0.0, 2.0), int(_number("K", k, 1, MAX_K, True)),
                   int(_number("max new tokens", max_new, 1, max_new_tokens, True)),
                   int(_number("seed", seed, 0, 2**31 - 1, True)))


def resolve_rule(name: Any) -> RuleSpec:
    """A registered rule by name, alias or label, any case (the API takes all three, e.g. the
    selector's old values "EARS", "ordinary", "greedy")."""
    try:
        return rule_spec(str(name))
    except ValueError:
        key = str(name).strip().lower()
        for spec in RULES.values():
            if key == spec.label.lower():
                return spec
        raise InputError(f"Unknown rule {name!r}: choose one of {', '.join(RULES)}.") from None


def check_params(spec: RuleSpec, values: Mapping[str, Any]) -> dict[str, float]:
    """The parameters ``spec`` takes, each within its ``Param`` range (a missing one: its default)."""
    out = {}
    for p in spec.params:
        value = values.get(p.name)
        out[p.name] = p.default if value is None else _number(p.name, value, p.low, p.high)
    return out
