"""evalsnap defers ADK's heavy optional imports (Vertex AI SDK, nltk) until first use.

The deferral is a start-up trick of the CLI's ``main`` (and of the processes evalsnap starts),
never of ``import evalsnap``: each probe installs it as ``main`` does
(``startup.install()``; ``tests/test_import_hygiene.py`` checks ``main`` itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROBE = """
import sys, evalsnap
from evalsnap import startup
startup.install()
import evalsnap.pipeline.plan
deferred = sorted(n for n in ("agentplatform", "vertexai", "rouge_score.rouge_scorer")
                  if type(sys.modules.get(n)).__name__ == "DeferredModule")
print("deferred", deferred, "aiplatform" , "google.cloud.aiplatform" in sys.modules)
print("pandas deferred", type(sys.modules["pandas"]).__name__)
from google.adk.dependencies.rouge_scorer import rouge_scorer, tokenizers
print("rouge", rouge_scorer.RougeScorer(["rouge1"]).score("a b", "a c")["rouge1"].fmeasure)
print("tokenizer", type(tokenizers.DefaultTokenizer(True)).__name__)
from google.adk.dependencies.vertexai import vertexai
print("vertexai", hasattr(vertexai.types, "PrebuiltMetric"), type(sys.modules["vertexai"]).__name__)
import pandas.core.frame  # a submodule first: the package's own code runs before it
import pandas as pd
print("pandas", pd.DataFrame({"a": [1, 2]})["a"].sum(), type(sys.modules["pandas"]).__name__)
"""


def test_heavy_modules_load_only_when_used_and_then_work(probes):
    out = probes("heavy")
    assert "deferred ['agentplatform', 'rouge_score.rouge_scorer', 'vertexai'] aiplatform False" \
        in out
    assert "rouge 0.5" in out and "tokenizer DefaultTokenizer" in out
    assert "vertexai True module" in out  # loaded on first use, a plain module after
    assert "pandas deferred DeferredModule" in out and "pandas 3 module" in out


def test_can_be_switched_off(probes):
    out = probes("off")
    assert "deferred [] aiplatform True" in out


PRELOAD = """
import sys, threading, evalsnap
from evalsnap import startup
startup.install()
import evalsnap.pipeline.plan
module = sys.modules["rouge_score.rouge_scorer"]
assert type(module).__name__ == "DeferredModule"
print("none for others", startup.preload(["tool_trajectory_avg_score"]) is None)
thread = startup.preload(["response_match_score"])
# Another thread uses the module while the preload may still be running it: it waits,
# it never sees a half-loaded module.
from google.adk.dependencies.rouge_scorer import rouge_scorer
print("rouge", rouge_scorer.RougeScorer(["rouge1"]).score("a b", "a c")["rouge1"].fmeasure)
thread.join(120)
print("loaded", type(module).__name__, not thread.is_alive())
"""


def test_preload_loads_what_a_metric_needs_in_the_background(probes):
    out = probes("preload")
    assert "none for others True" in out
    assert "rouge 0.5" in out
    assert "loaded module True" in out


MISSING = """
import sys, importlib.util, evalsnap
from evalsnap import startup
print("a2a installed", importlib.util.find_spec("a2a") is not None)
print("marked", startup.remember_missing())
try:
    from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
except ImportError as exc:
    print("still ImportError", type(exc).__name__)
print("again", startup.remember_missing(("json",)))
"""


def test_a_missing_optional_import_fails_fast_and_the_same_way(probes):
    out = probes("missing")
    if "a2a installed True" in out:  # then nothing is missing and nothing marked
        assert "marked []" in out
        return
    assert "marked ['google.adk.agents.remote_a2a_agent']" in out
    assert "still ImportError ModuleNotFoundError" in out
    assert "again []" in out  # an importable module is left alone


BROKEN = """
import sys, evalsnap
from evalsnap import startup
sys.path.insert(0, sys.argv[1])
print("registered", startup.install(("evalsnap_broken_dep",)))
module = sys.modules["evalsnap_broken_dep"]
for attempt in (1, 2):  # e.g. a failed background preload, then the metric's own use
    try:
        module.thing
    except ImportError as exc:
        print("attempt", attempt, type(exc).__name__, exc)
"""


def test_a_deferred_module_that_fails_to_load_raises_its_real_error_every_time(probes):
    out = probes("broken")
    assert "registered ['evalsnap_broken_dep']" in out
    assert "attempt 1 ImportError needs libfoo; install it" in out
    assert "attempt 2 ImportError needs libfoo; install it" in out


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory):
    """Every probe above, each in a fresh interpreter of its own, all started at once (they
    share nothing; mostly their imports, in parallel); ``probes(name)`` is one's stdout,
    after checking that it exited 0."""
    base = tmp_path_factory.mktemp("lazy-probes")
    broken = base / "broken"
    broken.mkdir()
    (broken / "evalsnap_broken_dep.py").write_text(
        "raise ImportError('needs libfoo; install it')\n")
    specs: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "heavy": ([PROBE], None),
        "off": ([PROBE], {**os.environ, "EVALSNAP_LAZY_IMPORTS": "0"}),
        "preload": ([PRELOAD], None),
        "missing": ([MISSING], None),
        "broken": ([BROKEN, str(broken)], None),
    }
    started = {}
    for name, (args, env) in specs.items():
        out, err = open(base / f"{name}.out", "w"), open(base / f"{name}.err", "w")
        started[name] = (subprocess.Popen([sys.executable, "-c", *args], cwd=ROOT, env=env,
                                          stdout=out, stderr=err, text=True), out, err)
    codes = {}
    try:
        for name, (proc, _out, _err) in started.items():
            codes[name] = proc.wait(timeout=300)
    finally:
        for proc, out, err in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
            err.close()

    def result(name: str) -> str:
        assert codes[name] == 0, Path(base / f"{name}.err").read_text()[-3000:]
        return Path(base / f"{name}.out").read_text()

    return result
