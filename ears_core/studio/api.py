"""The run endpoints' parameters, by name: what a gradio_client user reads in ``view_api()``.

Terms
-----
API name   Gradio names an endpoint's parameters after its handler's (a ``*args`` handler shows
           ``param_8``, ``param_9``, ...). The run handlers take one value per rule parameter the
           registry holds when the app is built, so their signatures are made here (``named``)
           from the sliders' names: ``/generate`` reads ``prompt, beta, temperature, k, max_new,
           seed, rule_name, with_baseline``, then the other rule parameters (``eps``, ``gate``,
           ``epsilon``, ...), then ``draft_length, shape, tree_budget``; ``/race`` reads the same
           request, ``rule_a, rule_b`` and the other rule parameters.
order      positional, as the page sends them (``controls``' terms: extra params); a client that
           sends only the leading ones gets the rest's defaults.
rule default  a rule parameter left at None takes the chosen rule's own default.
"""

from __future__ import annotations

import inspect
import keyword
from typing import Any, Callable, Iterator, Sequence

__all__ = ["REQUEST", "generate_params", "race_params", "named"]

REQUEST = ("prompt", "beta", "temperature", "k", "max_new", "seed")  # every run endpoint starts with these
_REQUIRED = inspect.Parameter.empty


def _rule_params(names: Sequence[str], taken: Sequence[str]) -> list[tuple[str, Any]]:
    """(name, None) for each rule parameter after beta; refuses a name that cannot be an API name."""
    out = []
    for name in names[1:]:
        if not name.isidentifier() or keyword.iskeyword(name) or name in taken:
            raise ValueError(f"a rule parameter named {name!r} cannot be an API parameter of the app "
                             f"(it must be a Python name other than {', '.join(taken)})")
        out.append((name, None))
    return out


def generate_params(names: Sequence[str]) -> list[tuple[str, Any]]:
    """``/generate``'s parameters as (name, default): ``names`` are the sliders' (beta first)."""
    head = [(n, _REQUIRED) for n in (*REQUEST, "rule_name", "with_baseline")]
    tail = [("draft_length", "policy"), ("shape", "auto"), ("tree_budget", 8)]
    return [*head, *_rule_params(names, [n for n, _ in head + tail]), *tail]


def race_params(names: Sequence[str], rule_a: str, rule_b: str) -> list[tuple[str, Any]]:
    """``/race``'s parameters as (name, default): ``names`` are the sliders' (beta first)."""
    head = [*((n, _REQUIRED) for n in REQUEST), ("rule_a", rule_a), ("rule_b", rule_b)]
    return [*head, *_rule_params(names, [n for n, _ in head])]


def named(fn: Callable[[dict[str, Any]], Iterator[Any]], params: Sequence[tuple[str, Any]]) -> Callable[..., Iterator[Any]]:
    """A generator handler with one named parameter per (name, default) of ``params``, in order,
    that calls ``fn`` with the values by name (defaults filled in). Gradio reads the signature
    for the API's names, and streams the handler's yields."""
    sig = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d)
                             for n, d in params])

    def handler(*args: Any, **kwargs: Any) -> Iterator[Any]:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        yield from fn(dict(bound.arguments))

    handler.__signature__ = sig  # type: ignore[attr-defined]
    handler.__name__ = handler.__qualname__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler
