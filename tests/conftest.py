"""Session-wide fixtures: one real ``prefect server`` on 127.0.0.1 for the whole run.

Starting Prefect's ephemeral API costs ~5 s per process; every CLI call in the tests (in this
process, :mod:`tests._cli`, or a subprocess) talks to this one server instead
(``PREFECT_API_URL``). The server is started in ``pytest_configure`` — before any test module
imports Prefect — and stopped by PID in ``pytest_unconfigure``. Under pytest-xdist the
controller starts it and hands its URL to the workers (``EVALSNAP_TEST_PREFECT_API_URL``), so
a run has one server, not one per worker; a server given that way from outside is used as is.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from evalsnap.startup import wait_healthy
from tests._cli import CliResult  # noqa: F401 - one result type for both ways to run the CLI

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SHOP = EXAMPLES / "shop_agent"
EVALSET = SHOP / "shop.evalset.json"
CONFIG = SHOP / "test_config.json"

_server: subprocess.Popen | None = None
# generous: on a shared 2-core machine under load the server has taken more than 90 s
_SERVER_START_TIMEOUT = 300
_home: str | None = None
# the recording server the xdist controller starts for its workers (recording_prefect_api)
_recording: subprocess.Popen | None = None
_recording_home: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The session's server records no events and no task runs: with them, its CPU per flow run
#: was about twice what the run itself spent in the test process (measured: 7 s against 2 s
#: for five demo runs), and only three modules read either back. Those ask for
#: :func:`recording_prefect_api`, a server with all its services, for the runs they inspect.
#: The other services (scheduler, late runs, foreman, triggers...) poll and cost nothing
#: measurable, but no test here needs them from the session's server either.
_LEAN_SERVER = {f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in (
    "EVENT_PERSISTER", "TASK_RUN_RECORDER", "SCHEDULER", "LATE_RUNS", "FOREMAN", "TRIGGERS",
    "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS", "REPOSSESSOR", "DB_VACUUM",
    "CLEANUP_RECONCILER", "EVENT_LOGGER")}


def start_prefect_server(home: str, extra_env: dict[str, str] | None = None
                         ) -> tuple[subprocess.Popen, str]:
    """A ``prefect server`` on a free 127.0.0.1 port with its home in ``home``, healthy:
    ``(process, API URL)``; the caller stops it with :func:`stop_prefect_server`."""
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": "", "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_UI_ENABLED": "false", **(extra_env or {})}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=open(Path(home) / "server.log", "wb"),
        start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    if not wait_healthy(url, server, timeout=_SERVER_START_TIMEOUT):
        log = (Path(home) / "server.log").read_text()[-2000:]
        stop_prefect_server(server)
        raise RuntimeError(f"prefect server did not become healthy in {_SERVER_START_TIMEOUT} s"
                           f" (exit code {server.poll()}): {log}")
    return server, url


def stop_prefect_server(server: subprocess.Popen) -> None:
    """Stops a server of :func:`start_prefect_server` (its whole process group, by PID)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(5)


def _start_prefect_server() -> None:
    global _server, _home
    _home = tempfile.mkdtemp(prefix="evalsnap-prefect-")
    _server, url = start_prefect_server(_home, _LEAN_SERVER)
    os.environ["PREFECT_API_URL"] = url
    os.environ["PREFECT_HOME"] = _home
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"


def _is_xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) \
        and not os.environ.get("PYTEST_XDIST_WORKER")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    # pytest-xdist's workers start with COLUMNS=80 (and LINES): the CLI then cuts its tables
    # at 80 columns, as it must when a user sets COLUMNS. Every CLI call of the suite runs
    # as in a CI log instead (no terminal, no COLUMNS: every column whole), with or without
    # xdist; a test that wants a width passes COLUMNS itself.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    os.environ["EVALSNAP_RETRY_DELAYS"] = "0,0"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # The repository root (tests.*, bench) and examples/, the demo agent's parent: the demo's
    # models are imported as `shop_agent.offline_models`, the name its config gives them.
    for path in (ROOT, EXAMPLES):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    if not os.environ.get("EVALSNAP_TEST_PREFECT_API_URL"):
        if _is_xdist_controller(config):  # the workers, started after this, inherit both
            global _recording, _recording_home
            _recording_home = tempfile.mkdtemp(prefix="evalsnap-prefect-recording-")
            with ThreadPoolExecutor(1) as pool:  # the two servers start side by side
                recording = pool.submit(start_prefect_server, _recording_home)
                try:
                    _start_prefect_server()
                finally:  # kept even when the other failed: unconfigure stops both
                    _recording, url = recording.result()
            os.environ["EVALSNAP_TEST_PREFECT_API_URL"] = os.environ["PREFECT_API_URL"]
            os.environ["EVALSNAP_TEST_RECORDING_API_URL"] = url
        else:
            _start_prefect_server()
    else:
        os.environ["PREFECT_API_URL"] = os.environ["EVALSNAP_TEST_PREFECT_API_URL"]
        if os.environ.get("PYTEST_XDIST_WORKER"):  # a client home of its own, as before
            global _home
            _home = tempfile.mkdtemp(prefix="evalsnap-prefect-client-")
            os.environ["PREFECT_HOME"] = _home


def pytest_unconfigure(config: pytest.Config) -> None:
    if _server is not None:
        stop_prefect_server(_server)
    if _recording is not None:
        stop_prefect_server(_recording)
    if _recording_home:
        shutil.rmtree(_recording_home, ignore_errors=True)
    if _home:
        shutil.rmtree(_home, ignore_errors=True)


#: Modules whose tests run the CLI in processes of their own, because a process is what they
#: test (signals, kill and resume, concurrent runs, start-up and exit, scoring pools, Dask,
#: deadlines that leave threads stuck): ``-m "not slow"`` leaves them out of a quick loop.
SLOW_MODULES = frozenset({
    "test_bench", "test_cli_process", "test_concurrent_runs", "test_dask", "test_deadlines",
    "test_hostile_code", "test_kill_resume", "test_prefect_deployments", "test_scoring_pool",
    "test_signals"})


#: The modules that take longest (measured on a full run), longest first: under
#: ``--dist loadfile`` xdist hands modules out in collection order, so these start first and
#: the run does not end with one worker busy on a long module while the other idles.
LONGEST_FIRST = (
    "test_remote_stores", "test_prefect_deployments", "test_gc", "test_adk_project_conventions",
    "test_bench", "test_store_requests", "test_signals",
    # placed by its own time (about 90 s alone), not yet measured on a full run
    "test_reuse_rules_s3", "test_reuse", "test_store_faults",
    "test_hostile_code", "test_agent_identity", "test_dask", "test_deadlines",
    "test_cli_process", "test_signals_after_result", "test_kill_resume", "test_faults3_gc",
    "test_site", "test_import_hygiene", "test_reports", "test_agent_identity_hostile",
    "test_lazy_imports", "test_repetitions", "test_scoring_pool", "test_langgraph_lane",
    "test_bad_inputs", "test_faults3", "test_walking_skeleton", "test_reuse_rules",
    "test_baselines_stick")


def _module_name(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    return module.__name__.rsplit(".", 1)[-1] if module is not None else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _module_name(item) in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module_name(item), len(rank)))  # stable: a
    # module's own tests keep their order


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> CliResult:
    """Runs ``evalsnap`` in a fresh process, as a user would."""
    proc = subprocess.run([sys.executable, "-m", "evalsnap.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, cwd=cwd or ROOT,
                          timeout=timeout)
    return CliResult(proc)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def golden_demo(tmp_path_factory: pytest.TempPathFactory):
    """The session's one cold run of the demo (:mod:`tests._golden`); ``.copy(dir)`` per use."""
    from tests._golden import build_golden_demo

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the workers' common base directory
    return build_golden_demo(shared / "golden-demo")


@pytest.fixture(scope="session")
def recording_prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API URL of a ``prefect server`` with every service (events and task runs
    recorded), for a test that reads either back. Under pytest-xdist the controller starts
    it with the session's server and the workers share it (``EVALSNAP_TEST_RECORDING_API_URL``:
    one start instead of one per worker that needs it); otherwise it starts at first use.
    The session's own server records neither (``_LEAN_SERVER``). Prefect's settings
    are read when a process starts: a CLI call given this URL in its ``env`` runs in a
    process of its own (:func:`tests._cli.needs_a_process`); in this process, read from
    it inside :func:`prefect_api`."""
    shared = os.environ.get("EVALSNAP_TEST_RECORDING_API_URL")
    if shared:
        yield shared
        return
    home = tempfile.mkdtemp(prefix="evalsnap-prefect-recording-")
    server, url = start_prefect_server(home)
    try:
        yield url
    finally:
        stop_prefect_server(server)
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def prefect_api(url: str) -> Iterator[None]:
    """Prefect clients made in this process inside the block talk to ``url``."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def copy_agent(src: Path, dst: Path) -> Path:
    """A private copy of the agent project ``src`` at ``dst``: no caches, no ADK history."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", ".adk"))
    return dst


def copy_shop(dst: Path) -> Path:
    """A private copy of the example agent dir at ``dst`` (eval set and config included)."""
    return copy_agent(SHOP, dst)


def set_env_value(env_file: Path, key: str, value: str) -> None:
    """Gives ``key`` a new value in a ``.env`` file (the other lines kept)."""
    lines = [f"{key}={value}" if line.startswith(f"{key}=") else line
             for line in env_file.read_text().splitlines()]
    env_file.write_text("\n".join(lines) + "\n")


@pytest.fixture
def shop_copy(tmp_path: Path) -> Path:
    """A private copy of the example agent dir (eval set and config included)."""
    return copy_shop(tmp_path / "agents" / "shop_agent")
