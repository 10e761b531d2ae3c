"""Every exit code of the ``evalsnap`` command, decided in one place (docs/exit-codes.md).

A command ends with one *outcome*; :func:`exit_code` maps it to the process exit code:

==========================  ====  ======================================================
outcome                     code  meaning
==========================  ====  ======================================================
``Verdict`` passed          0     every gate passed (or ``--fail-on`` let it through)
``Verdict`` quality         1     a metric FAILED (or, ``--fail-on regression``, a
                                  regression against the baseline)
``Findings`` found          1     ``verify`` found a problem, ``diff --fail-on-change``
                                  a change
``Failed`` typed error      2     bad usage, config or input: any :class:`EvalsnapError`
                                  (its ``exit_code``)
``Verdict`` incomplete      3     execution incomplete: a failed inference, a unit
                                  NOT_EVALUATED
``Failed`` crash            4     an internal error (a bug of evalsnap: please report it)
``Stopped``                 128+N stopped by signal N: 129 SIGHUP, 130 SIGINT, 143 SIGTERM
``SystemExit(x)``           x     code that ends the command itself: Python's own rule
                                  (:func:`of_system_exit`: None 0, an int itself, else 1)
==========================  ====  ======================================================

Several outcomes of one run (one record per eval set) combine with :func:`worst`: an
internal error over bad usage over incomplete over a quality failure over passed.

Pure and light: it imports only :mod:`evalsnap.errors` (no Prefect, no ADK).
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from evalsnap.errors import EvalsnapError

__all__ = ["ExitCode", "FailOn", "Failed", "Findings", "Outcome", "Stopped", "Verdict",
           "exit_code", "of_system_exit", "severity", "worst"]

FailOn = Literal["quality", "incomplete", "regression", "never"]


class ExitCode(enum.IntEnum):
    """The codes of the table above (the signal codes are ``128 + N``)."""

    OK = 0
    QUALITY = 1
    USAGE = 2
    INCOMPLETE = 3
    INTERNAL = 4
    SIGHUP = 128 + signal.SIGHUP
    SIGINT = 128 + signal.SIGINT
    SIGTERM = 128 + signal.SIGTERM


@dataclass(frozen=True)
class Verdict:
    """What a run, rescore or replay found: its record's own verdict, and (with a baseline)
    whether a unit regressed; ``fail_on`` says which of them fails the command."""

    complete: bool
    passed: bool
    regressed: bool = False
    fail_on: FailOn = "quality"


@dataclass(frozen=True)
class Findings:
    """A check that found something (``verify``'s problems, ``diff --fail-on-change``)."""

    found: bool


@dataclass(frozen=True)
class Failed:
    """The command raised: a typed error of :mod:`evalsnap.errors`, or anything else (a crash)."""

    error: BaseException


@dataclass(frozen=True)
class Stopped:
    """A signal stopped the command (SIGINT, SIGTERM, SIGHUP)."""

    signum: int


Outcome = Verdict | Findings | Failed | Stopped


def exit_code(outcome: Outcome) -> int:
    """The process exit code of ``outcome`` (the module's table), a plain ``int``."""
    return int(_code(outcome))


def _code(outcome: Outcome) -> int:
    match outcome:
        case Verdict(complete=complete, passed=passed, regressed=regressed, fail_on=fail_on):
            return _gate(complete, passed, regressed, fail_on)
        case Findings(found=found):
            return ExitCode.QUALITY if found else ExitCode.OK
        case Failed(error=error):
            if isinstance(error, EvalsnapError):
                return int(error.exit_code)
            return ExitCode.INTERNAL
        case Stopped(signum=signum):
            return 128 + int(signum)
    raise TypeError(f"not an outcome: {outcome!r}")


def _gate(complete: bool, passed: bool, regressed: bool, fail_on: str) -> int:
    if fail_on == "quality":
        if not complete:
            return ExitCode.INCOMPLETE
        return ExitCode.OK if passed else ExitCode.QUALITY
    if fail_on == "incomplete":
        return ExitCode.OK if complete else ExitCode.INCOMPLETE
    if fail_on == "regression":
        return ExitCode.QUALITY if regressed else ExitCode.OK
    if fail_on == "never":
        return ExitCode.OK
    from evalsnap.errors import UsageError

    raise UsageError(f"--fail-on {fail_on!r} is unknown; choose one of "
                     "['quality', 'incomplete', 'regression', 'never'].")


#: Which code wins when outcomes combine (a run over several eval sets); higher wins.
_SEVERITY = {ExitCode.OK: 0, ExitCode.QUALITY: 1, ExitCode.INCOMPLETE: 2, ExitCode.USAGE: 3,
             ExitCode.INTERNAL: 4}


def severity(code: int) -> int:
    """How bad ``code`` is; an unknown code counts as an internal error."""
    return _SEVERITY.get(code, _SEVERITY[ExitCode.INTERNAL])  # type: ignore[call-overload]


def worst(codes: Iterable[int]) -> int:
    """The code of several outcomes together (0 for none)."""
    return int(max(codes, key=severity, default=ExitCode.OK))


def of_system_exit(code: object) -> int:
    """The exit code of ``SystemExit(code)``, as Python's own exit gives it (a message, which
    the caller prints, is 1)."""
    if code is None:
        return int(ExitCode.OK)
    if isinstance(code, int):
        return int(code)
    return int(ExitCode.QUALITY)  # Python's code for SystemExit("message"); not a verdict
