"""The packed read: a round's verdict as one float64 vector, laid out by a declared list of fields.

Terms (host read: device_round.py)
-----
field      a name, a kind (FLOAT, INT or BOOL: what the host makes of its values) and a width: one value (a
           scalar: ``per`` None), or as many as a size of the round (``per``, e.g. "k", "n", "depth") plus ``plus``.
layout     the fields in order. ``pack`` lays the tensors named by the fields end to end as float64 (token ids and
           flags are exact in float64); ``unpack`` cuts the vector read to the host back into the fields by name
           (a scalar as one value, else a list). Both follow the one list, so they cannot disagree on an offset.
sizes      the round's sizes by name (``k=3``; ``n=6, depth=2``): each field's width.
layouts    ``CHAIN_READ`` (a chain round: chain.RoundHost, the device chain's confidences included) and
           ``TREE_READ`` (a tree round: tree.TreeHost, device_tree.pack / unpack).
cost       ``pack`` casts each run of fields that share a dtype in one op, so the fields cost a few kernels, not one
           each (each costs more on a CPU right after a model pass; on a GPU each is a launch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["FLOAT", "INT", "BOOL", "Field", "Layout", "CHAIN_READ", "TREE_READ"]

FLOAT, INT, BOOL = "float", "int", "bool"
_CAST = {FLOAT: float, INT: int, BOOL: bool}


@dataclass(frozen=True)
class Field:
    """One field of a layout (module terms)."""

    name: str
    kind: str  # FLOAT, INT or BOOL
    per: str | None = None  # the size it is as wide as; None: one value
    plus: int = 0

    def width(self, sizes: dict[str, int]) -> int:
        if self.per is None:
            return 1
        if self.per not in sizes:
            raise ValueError(f"field {self.name!r} is as wide as {self.per!r}: pass {self.per}= (got {sorted(sizes)})")
        return sizes[self.per] + self.plus


class Layout:
    """A packed vector's fields in order (module terms)."""

    def __init__(self, *fields: Field) -> None:
        if len({f.name for f in fields}) != len(fields) or any(f.kind not in _CAST for f in fields):
            raise ValueError("a layout's fields need distinct names and a kind of FLOAT, INT or BOOL")
        self.fields = fields

    def __add__(self, more: "Layout") -> "Layout":
        return Layout(*self.fields, *more.fields)

    def size(self, **sizes: int) -> int:
        """The packed vector's length for these sizes."""
        return sum(f.width(sizes) for f in self.fields)

    def pack(self, values: dict[str, Tensor], **sizes: int) -> Tensor:
        """(L,) float64 on the values' device: each field's tensor (any shape with its width of elements) in order.
        Shapes are checked (no host read)."""
        runs: list[list[Tensor]] = []
        for f in self.fields:
            t = values[f.name].reshape(-1)
            if t.numel() != f.width(sizes):
                raise ValueError(f"field {f.name!r} has {t.numel()} values, its layout says {f.width(sizes)}")
            if runs and runs[-1][0].dtype == t.dtype:
                runs[-1].append(t)
            else:
                runs.append([t])
        return torch.cat([torch.cat(run).double() for run in runs])  # a cast per run of one dtype

    def unpack(self, f: list[float], **sizes: int) -> dict[str, Any]:
        """The fields by name from ``pack``'s vector read to the host (``f`` may run on past them)."""
        out, at = {}, 0
        for fd in self.fields:
            w, cast = fd.width(sizes), _CAST[fd.kind]
            out[fd.name] = cast(f[at]) if fd.per is None else [cast(x) for x in f[at: at + w]]
            at += w
        if at > len(f):
            raise ValueError(f"a packed vector of {len(f)} values is shorter than its layout ({at})")
        return out


def _per(kind: str, per: str | None, *names: str, plus: int = 0) -> tuple[Field, ...]:
    return tuple(Field(name, kind, per, plus) for name in names)


# A chain round's read (chain.RoundHost): k drafts; c confidences (k, or 0 when the round read none).
CHAIN_READ = Layout(
    *_per(FLOAT, "k", "p", "q", "ratio", "u", "tolerance", "distortion"), Field("max_p", FLOAT, "k", 1),
    *_per(FLOAT, None, "next_p", "next_q"), Field("confidences", FLOAT, "c"),
    *_per(INT, None, "num_accepted", "next_token"), Field("tokens", INT, "k"), Field("kinds", INT, "k"),
)

# A tree round's read (tree.TreeHost, device_tree.py): n nodes, a path as deep as depth; e emitted positions with a
# distortion (depth + 1, or 0 when the round computed none).
TREE_READ = Layout(
    *_per(FLOAT, "n", "p", "q", "ratio", "u", "tolerance"), Field("max_p", FLOAT, "n", 1),
    *_per(FLOAT, None, "next_p", "next_q"), *_per(FLOAT, "n", "scores", "priorities"),
    *_per(INT, None, "num_accepted", "next_token", "last_rejected"), Field("path", INT, "depth"),
    Field("tokens", INT, "n"), Field("kinds", INT, "n"), Field("is_bonus", BOOL), Field("alive", BOOL, "n"),
    Field("distortion", FLOAT, "e"), Field("distortion_exact", BOOL, "e"),
)
