"""Issue 26 item 7: one exit-code policy (:mod:`evalsnap.exitcodes`), and an internal error
has its own code, 4 (3 is "execution incomplete"). docs/exit-codes.md is the table."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evalsnap import errors, exitcodes
from evalsnap.exitcodes import ExitCode, Failed, Findings, Stopped, Verdict, exit_code, worst
from tests.conftest import ROOT


@pytest.mark.parametrize("verdict, codes", [
    # (complete, passed, regressed) → code under quality, incomplete, regression, never
    ((True, True, False), (0, 0, 0, 0)),
    ((True, False, False), (1, 0, 0, 0)),
    ((False, False, False), (3, 3, 0, 0)),
    ((False, True, False), (3, 3, 0, 0)),
    ((True, True, True), (0, 0, 1, 0)),
    ((True, False, True), (1, 0, 1, 0)),
    ((False, False, True), (3, 3, 1, 0)),
])
def test_a_verdict_gives_the_code_of_its_gate(verdict, codes):
    complete, passed, regressed = verdict
    got = tuple(exit_code(Verdict(complete, passed, regressed, fail_on))
                for fail_on in ("quality", "incomplete", "regression", "never"))
    assert got == codes


def test_other_outcomes():
    from storage.errors import StoreUnavailable

    assert exit_code(Findings(found=True)) == 1 and exit_code(Findings(found=False)) == 0
    assert exit_code(Failed(errors.UsageError("x"))) == 2
    assert exit_code(Failed(StoreUnavailable("s3://b", "gone"))) == 2
    assert exit_code(Failed(RuntimeError("a bug"))) == ExitCode.INTERNAL == 4
    assert exit_code(Failed(RecursionError())) == 4
    assert [exit_code(Stopped(s)) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)] \
        == [129, 130, 143]
    assert type(exit_code(Verdict(True, True))) is int  # plain JSON in the --json object
    with pytest.raises(errors.UsageError):
        exit_code(Verdict(True, True, fail_on="sometimes"))  # type: ignore[arg-type]


def test_worst_of_several():
    assert worst([]) == 0
    assert worst([0, 1, 0]) == 1
    assert worst([1, 3, 0]) == 3
    assert worst([3, 2]) == 2  # bad usage wins over incomplete (the README: "2 wins over 3")
    assert worst([2, 4, 3]) == 4
    assert worst([3, 99]) == 99  # an unknown code counts as an internal error


# ---- the command line: a crash is exit 4 -----------------------------------------------------

CRASH = """
import os, sys
sys.argv = ["evalsnap", *sys.argv[2:]]
where = os.environ["CRASH_AT"]
def boom(*args, **kwargs):
    raise RuntimeError("planted bug")
if where == "store":  # inside a command's own handling
    import evalsnap.records.repo as repo
    repo.open_store = boom
elif where == "flow":  # inside the flow run
    import evalsnap.reports.suite as suite
    suite.combined = boom
elif where == "main":  # outside any command (the app itself)
    import evalsnap.cli._app as app_module
    app_module.app = boom
from evalsnap.cli import main
main()
"""


def _crash(where: str, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-c", CRASH, "-", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CRASH_AT": where})


def test_an_internal_error_in_a_command_exits_4(tmp_path: Path):
    proc = _crash("store", "show", "latest", "--store", str(tmp_path / "s"), "--json")
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "internal error:" in proc.stderr and "RuntimeError: planted bug" in proc.stderr
    assert "Please report it" in proc.stderr and proc.stdout == ""


def test_an_internal_error_in_a_run_exits_4_and_prints_no_result(shop_copy, tmp_path: Path):
    proc = _crash("flow", "run", str(shop_copy), f"{shop_copy / 'shop.evalset.json'}:weather_paris",
                  "--store", str(tmp_path / "s"), "--json")
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "internal error:" in proc.stderr and "planted bug" in proc.stderr
    assert proc.stdout == ""  # no JSON: a crash is never a verdict


def test_an_internal_error_outside_any_command_exits_4():
    proc = _crash("main", "ls")
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "internal error:" in proc.stderr and "Traceback" in proc.stderr


def test_a_usage_error_stays_2_and_a_quality_verdict_is_not_a_crash(cli, tmp_path: Path):
    result = cli("show", "nosuchrun", "--store", str(tmp_path / "s"))
    assert result.code == 2 and "internal error" not in result.stderr


# ---- one place decides ------------------------------------------------------------------------

#: Calls that end a process or a command with a code.
_ENDINGS = {"Exit", "exit", "_exit", "leave_now"}
#: Places outside exitcodes.py known to spell a code out, each owned by an open change.
def _literal_codes(path: Path, root: Path) -> list[str]:
    """``file:line`` of each ending call given a non-zero integer literal (``Exit(1)``,
    ``Exit(0 if ok else 1)``); 0 for a process that has nothing to report is allowed."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        if name not in _ENDINGS or not node.args:
            continue
        literals = [n.value for n in ast.walk(node.args[0])
                    if isinstance(n, ast.Constant) and type(n.value) is int and n.value != 0]
        if literals:
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def _violations(root: Path = ROOT) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in sorted((root / "evalsnap").rglob("*.py")):
        if path.name != "exitcodes.py" and (hits := _literal_codes(path, root)):
            out[str(path.relative_to(root))] = hits
    return out


def test_no_exit_code_is_spelled_out_outside_the_policy():
    assert _violations() == {}, "exit codes decided outside evalsnap/exitcodes.py"


def test_the_finder_finds_a_literal(tmp_path: Path):
    (tmp_path / "evalsnap").mkdir()
    (tmp_path / "evalsnap" / "bad.py").write_text(
        "import typer\ndef f(ok):\n    raise typer.Exit(0 if ok else 3)\n")
    (tmp_path / "evalsnap" / "good.py").write_text("import os\nos._exit(0)\n")
    assert _violations(tmp_path) == {"evalsnap/bad.py": ["evalsnap/bad.py:3"]}


def test_the_documented_table_is_the_policy():
    text = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    for code in ExitCode:
        assert f"| {int(code)} |" in text, f"docs/exit-codes.md lacks {code!r}"
    assert exitcodes.__doc__ and "internal error" in exitcodes.__doc__
