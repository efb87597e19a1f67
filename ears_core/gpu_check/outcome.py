"""What the GPU check found: one ``Check`` per question, gathered in a ``Report``.

Terms
-----
check     one question with a verdict: "pass", "fail" or "skip" (the pieces it needs are not on this
          machine: a skip is never counted as a pass), a one-line ``detail`` a person reads, and the
          ``figures`` behind it (counts, p-values, prices) for the JSON line.
report    every check in the order run, plus the speed figures; printed as a short table, then one
          line of JSON (``gpu_check: {...}``) a script can parse. Its exit code: 0 when no check
          failed, 1 when one did (``EXIT_NO_CUDA`` = 2 is the caller's, before any check runs).
JSON file the same JSON written to ``json_path`` after every check (a whole file each time, replaced at
          once), with ``complete`` false until the last check ran: a run stopped at a time limit still
          leaves every check that finished, with the machine named.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

__all__ = ["Check", "Report", "EXIT_OK", "EXIT_FAILED", "EXIT_NO_CUDA"]

EXIT_OK, EXIT_FAILED, EXIT_NO_CUDA = 0, 1, 2
STATUSES = ("pass", "fail", "skip")


@dataclass
class Check:
    """One question's verdict (see the module's terms)."""

    name: str
    status: str
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"a check's status is one of {STATUSES}, got {self.status!r}")


@dataclass
class Report:
    """The checks run so far and the context they ran in (device, versions)."""

    context: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    out: TextIO = sys.stdout
    json_path: Path | None = None  # module terms: JSON file
    complete: bool = False

    def run(self, name: str, fn: Callable[[], Check]) -> Check:
        """Run one check, time it, print its line; an exception is that check's failure (with the
        exception's last line), never the end of the report."""
        t0 = time.perf_counter()
        try:
            check = fn()
        except Exception as exc:  # a crash is a failed check: the report still comes out whole
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            check = Check(name, "fail", f"raised {last}", {"traceback": traceback.format_exc(limit=6)})
        check.name, check.seconds = name, round(time.perf_counter() - t0, 2)
        self.checks.append(check)
        print(f"  {check.status.upper():4}  {name:<28} {check.detail}  ({check.seconds:.1f} s)", file=self.out,
              flush=True)
        self.save()
        return check

    def finish(self) -> None:
        """Every check has run: the JSON file says so."""
        self.complete = True
        self.save()

    def save(self) -> None:
        """Write the JSON file, if one was asked for (module terms)."""
        if self.json_path is None:
            return
        path = Path(self.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        part.write_text(json.dumps(self.body(), default=_plain, indent=1) + "\n", encoding="utf-8")
        os.replace(part, path)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def exit_code(self) -> int:
        return EXIT_FAILED if self.failed else EXIT_OK

    def summary_line(self) -> str:
        counts = {s: sum(c.status == s for c in self.checks) for s in STATUSES}
        verdict = "FAILED" if self.failed else "OK"
        return (f"gpu_check {verdict}: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped "
                f"on {self.context.get('device_name', self.context.get('device'))}")

    def body(self) -> dict[str, Any]:
        """The report as JSON data: the verdict, the machine and versions, every check."""
        return {"ok": not self.failed, "complete": self.complete, **self.context,
                "checks": [{k: v for k, v in asdict(c).items() if k != "figures" or v} for c in self.checks]}

    def json_line(self) -> str:
        return "gpu_check: " + json.dumps(self.body(), default=_plain, sort_keys=False)


def _plain(value: Any) -> Any:
    """JSON for what json cannot write itself (tensors' items, dtypes, paths)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
