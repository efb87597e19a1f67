"""Waits counted on the host: the calls inside a block that make (or, run on a GPU, would make) the host wait.

Terms
-----
wait        the host stops until the device has done all its queued work. On CUDA three kinds of call wait:
            python  a tensor made from Python data: ``torch.tensor`` / ``torch.as_tensor`` / ``Tensor.new_tensor``
                    of a list, tuple or number, or a tensor indexed (read or written) with a Python list. The
                    data is laid out in pageable host memory and, for the device, copied there: a wait.
            copy    a host-to-device copy: ``.to`` / ``.cuda()`` of a host tensor onto the device, ``copy_`` from
                    a host tensor into a device tensor. From pageable memory the copy waits for the device.
            read    the device's values read on the host: ``item``, ``tolist``, ``numpy``, ``bool()``, ``int()``,
                    ``float()``, ``__index__`` (a tensor used as a Python index), ``nonzero`` (its shape depends on
                    the data), ``torch.equal`` / ``allclose``, ``.cpu()`` and ``.to`` of a device tensor to the
                    host, and on CUDA an event, stream or device ``synchronize``.
            Each call counts once, under the first kind that fits (python, copy, read); a call made inside a
            counted one (torch's own Python code) does not count again.
device      the round's device (``counting(device)``). On CUDA the kinds are told apart by where the tensors are:
            a read is of a device tensor, a copy goes from a CPU tensor to the device.
on the CPU  (the convention) device and host are one, so nothing tells a host tensor from a device one: every
            read method counts (on a GPU the tensor would be the device's), and every ``.to`` / ``.cuda()`` that
            names a device counts as a copy, whatever the devices (on a GPU it moves host data onto the device,
            or is a call that does nothing) unless it is torch's or transformers' own code, which moves tensors
            that already live on the model's device (rotary tables, masks). ``copy_`` is never counted there.
            A tensor made from Python data counts wherever it is made.
sites       each wait's call site, ``file:line`` of the first frame outside torch and this module, for finding it.

``counting(device)`` counts every wait inside a ``with`` block into one ``Waits``; ``counting_rounds(shape_cls,
device)`` counts them per round of a round shape (rounds.py), from its ``propose`` to the end of its ``commit``.
Both patch torch's functions and ``Tensor`` methods for the block and restore them after; only the thread that
opened the block is counted.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

__all__ = ["Waits", "counting", "counting_rounds", "KINDS"]

KINDS = ("python", "copy", "read")
READS = ("item", "tolist", "numpy", "nonzero", "cpu", "__bool__", "__int__", "__float__", "__index__")
_TORCH = os.path.dirname(torch.__file__) + os.sep  # never a site
_OWN_DEVICE = ("torch", "transformers")  # their .to(device) moves tensors already on the model's device (on the CPU)
_MISSING = object()


@dataclass
class Waits:
    """The waits of one block, by kind (module terms), with their call sites."""

    python: int = 0
    copy: int = 0
    read: int = 0
    sites: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})

    @property
    def total(self) -> int:
        return self.python + self.copy + self.read

    def add(self, kind: str, site: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.sites[kind].append(site)

    def __str__(self) -> str:
        where = "; ".join(f"{k}: {', '.join(self.sites[k])}" for k in KINDS if self.sites[k])
        return f"{self.read} read, {self.python} python, {self.copy} copy" + (f" ({where})" if where else "")


def _site() -> str:
    """file:line of the first frame outside torch and this module."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename == __file__ or f.f_code.co_filename.startswith(_TORCH)):
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.relpath(f.f_code.co_filename)}:{f.f_lineno}"


def _python_data(data: Any) -> bool:
    return not isinstance(data, Tensor)


def _list_index(index: Any) -> bool:
    """An index that holds a Python list (advanced indexing from host data)."""
    return isinstance(index, list) or (isinstance(index, tuple) and any(isinstance(i, list) for i in index))


def _named_device(args: tuple, kwargs: dict) -> torch.device | None:
    """The device a ``.to(...)`` call names, or None (a dtype only)."""
    target = kwargs.get("device")
    if target is None and args:
        first = args[0]
        target = first.device if isinstance(first, Tensor) else first
    if isinstance(target, (str, int, torch.device)) and not isinstance(target, bool):
        return torch.device(target) if not isinstance(target, int) else torch.device("cuda", target)
    return None


class _Counter:
    """The patches of one ``with`` block, and the record they count into (None: not counting now)."""

    def __init__(self, device: torch.device) -> None:
        self.cpu = device.type == "cpu"
        self.thread = threading.get_ident()
        self.busy = threading.local()
        self.record: Waits | None = None
        self.saved: list[tuple[Any, str, Any]] = []

    # ------------------------------------------------------------------ what counts
    def on_device(self, t: Tensor) -> bool:
        return self.cpu or t.device.type != "cpu"

    def kind_of_move(self, t: Tensor, target: torch.device | None, caller: str) -> str | None:
        """A ``.to`` / ``.cuda`` / ``.cpu`` of t onto ``target`` (module terms)."""
        if target is None:
            return None
        if self.cpu:
            return None if caller.split(".")[0] in _OWN_DEVICE else "copy"
        if t.device.type == "cpu" and target.type != "cpu":
            return "copy"
        return "read" if t.device.type != "cpu" and target.type == "cpu" else None

    # ------------------------------------------------------------------ patching
    def wrap(self, owner: Any, name: str, kind: Callable[..., str | None]) -> None:
        """Replace owner.name by a wrapper that counts ``kind(*args, **kwargs)`` (a kind or None) before the call."""
        inner = getattr(owner, name)
        self.saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        counter = self

        def counted(*args: Any, **kwargs: Any) -> Any:
            if counter.record is None or threading.get_ident() != counter.thread or getattr(counter.busy, "on", False):
                return inner(*args, **kwargs)
            try:
                k = kind(*args, **kwargs)
            except TypeError:  # a call form the kind does not read (keywords): torch answers it as ever
                k = None
            if k is not None:
                counter.record.add(k, _site())
            counter.busy.on = True
            try:
                return inner(*args, **kwargs)
            finally:
                counter.busy.on = False

        counted.__name__ = getattr(inner, "__name__", name)
        setattr(owner, name, counted)

    def install(self) -> None:
        t = torch.Tensor
        self.wrap(torch, "tensor", lambda data, *a, **k: "python" if _python_data(data) else None)
        self.wrap(torch, "as_tensor", lambda data, *a, **k: "python" if _python_data(data) else None)
        self.wrap(t, "new_tensor", lambda self_, data, *a, **k: "python" if _python_data(data) else None)
        self.wrap(t, "__getitem__", lambda self_, index: "python" if _list_index(index) else None)
        self.wrap(t, "__setitem__", lambda self_, index, value: "python" if _list_index(index) else None)
        self.wrap(t, "to", lambda self_, *a, **k: self.kind_of_move(self_, _named_device(a, k), _caller()))
        self.wrap(t, "cuda", lambda self_, *a, **k: self.kind_of_move(self_, torch.device("cuda"), _caller()))
        self.wrap(t, "copy_", lambda self_, src, *a, **k:
                  "copy" if not self.cpu and self_.device.type != "cpu" and src.device.type == "cpu" else None)
        for name in READS:
            self.wrap(t, name, lambda self_, *a, **k: "read" if self.on_device(self_) else None)
        for name in ("nonzero", "equal", "allclose"):
            self.wrap(torch, name, lambda x, *a, **k: "read" if self.on_device(x) else None)
        if not self.cpu and torch.cuda.is_available():
            for owner in (torch.cuda.Event, torch.cuda.Stream):
                self.wrap(owner, "synchronize", lambda *a, **k: "read")
            self.wrap(torch.cuda, "synchronize", lambda *a, **k: "read")

    def restore(self) -> None:
        for owner, name, before in reversed(self.saved):
            if before is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, before)
        self.saved.clear()


def _caller() -> str:
    """The module name of the code that called the patched method (two frames up from the kind function)."""
    f = sys._getframe(3)
    return f.f_globals.get("__name__", "") if f is not None else ""


@contextmanager
def counting(device: torch.device | str = "cpu") -> Iterator[Waits]:
    """Count the waits inside the block (module terms) for a round on ``device``."""
    counter = _Counter(torch.device(device))
    counter.record = Waits()
    counter.install()
    try:
        yield counter.record
    finally:
        counter.restore()


def _sync_debug(mode: str) -> None:
    torch.cuda.set_sync_debug_mode(mode)


@contextmanager
def counting_rounds(shape_cls: type, device: torch.device | str = "cpu", sync_errors: bool = False
                    ) -> Iterator[list[Waits]]:
    """Count the waits of every round of shapes of class ``shape_cls`` run inside the block, one ``Waits`` a round:
    from the start of its ``propose`` to the end of its ``commit`` (rounds.py: the round's four steps).
    ``sync_errors`` (CUDA only): the rounds after the first run under ``torch.cuda.set_sync_debug_mode("error")``,
    so that a wait CUDA itself sees raises there."""
    counter = _Counter(torch.device(device))
    rounds: list[Waits] = []
    propose, commit = shape_cls.__dict__.get("propose", _MISSING), shape_cls.__dict__.get("commit", _MISSING)
    inner_propose, inner_commit = shape_cls.propose, shape_cls.commit

    def counted_propose(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter.record = Waits()
        rounds.append(counter.record)
        if sync_errors and len(rounds) > 1:
            _sync_debug("error")
        return inner_propose(self, *args, **kwargs)

    def counted_commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return inner_commit(self, *args, **kwargs)
        finally:
            counter.record = None
            if sync_errors:
                _sync_debug("default")

    shape_cls.propose, shape_cls.commit = counted_propose, counted_commit
    counter.install()
    try:
        yield rounds
    finally:
        counter.restore()
        if sync_errors:
            _sync_debug("default")
        for name, before in (("propose", propose), ("commit", commit)):
            if before is _MISSING:
                delattr(shape_cls, name)
            else:
                setattr(shape_cls, name, before)
