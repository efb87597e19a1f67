"""Names that changed: the old name still works for a while and warns.

renamed keyword   the draft length K (drafts per round at most) was called ``gamma``; it is ``k`` now
                  (``generate(..., k=)``, ``stream(..., k=)``, ``RunConfig.k``, ``Session.policy_for(k=)``).
                  ``gamma=`` is accepted as an alias of ``k=`` and emits a ``DeprecationWarning``.
renamed option    on the command line ``--gamma`` is an alias of ``--k`` (``-K``), and the bench's
                  ``--gammas`` / ``--policy-gammas`` of ``--ks`` / ``--policy-ks``; hidden from ``--help``,
                  they print a note on stderr.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

__all__ = ["renamed_keyword", "add_renamed_option"]


def _caller_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel of the first frame outside ears_core (the user's call)."""
    level, frame = 2, sys._getframe(2)  # 1: warn's caller (renamed_keyword); 2: the function that called it
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "ears_core":
        frame, level = frame.f_back, level + 1
    return level


def renamed_keyword(new_value: Any, old_value: Any, *, default: Any, where: str, old: str = "gamma",
                    new: str = "k") -> Any:
    """The value of keyword ``new`` when its former name ``old`` may have been given too.

    ``old_value`` None: the old name was not given, ``new_value`` stands. Otherwise a DeprecationWarning
    (pointing at the caller's line outside ears_core) and ``old_value`` stands; a ``new_value`` that is
    not the default and differs from it is a TypeError (two values for one setting).
    """
    if old_value is None:
        return new_value
    if new_value != default and new_value != old_value:
        raise TypeError(f"{where}: got {old}={old_value!r} and {new}={new_value!r}; {old} is the old name of "
                        f"{new}: pass {new}= only")
    warnings.warn(f"{where}: the keyword {old}= is deprecated, use {new}= ({new}={old_value!r})", DeprecationWarning,
                  stacklevel=_caller_stacklevel())
    return old_value


class _RenamedOption(argparse.Action):
    """Stores into the new option's dest and says on stderr that the option was renamed."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"note: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_option(parser: argparse.ArgumentParser, old: str, new: str, dest: str, type: Any) -> None:
    """``old`` (e.g. "--gamma") as a hidden alias of the option ``new`` (e.g. "--k") whose value lands in ``dest``.
    Add it after ``new``, whose default stands when neither is given."""
    parser.add_argument(old, dest=dest, type=type, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                        action=_RenamedOption, new=new)
