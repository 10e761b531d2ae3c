"""Issue 31: the reuse-rules table of ``tests/test_reuse_rules.py`` on a moto S3 bucket — a
damaged or deleted object in the bucket (a unit, an inference, a judge entry) is still never
reused and still found by ``evalsnap verify``, Prefect's task cache in the bucket still runs
no planted code, incomplete units cached there are still scored again, and judge answers
still come from the ledger in the bucket.

Every scenario whose outcome depends on what the bucket holds runs here. The four that
change only the config or the flags and read nothing the others do not (``LOCAL_ONLY``: a
versioned metric left alone, a deterministic threshold, an evaluator version, ``--force``)
are decided before any object is read and run on local disk only: on moto each cost 6-11 s
of a suite kept under 10 minutes.

The table, its checks and :func:`tests.test_reuse_rules.play` are imported unchanged; only
the store differs. The prepared store (``run``, then ``run --reuse``) is made once under a
prefix of the bucket, and each scenario gets a private copy under a new prefix (server-side
copies). Every file the scenarios touch, they touch in the bucket, by store-relative path
(:class:`tests.test_reuse_rules.StoreFiles` on ``s3fs``).

The environment is the one ``tests.test_remote_stores._env`` gives a CLI call against moto
(dummy credentials, the moto endpoint): the part of it that this process does not already
have is passed to every CLI call (run in the test process, :mod:`tests._cli`, as the
local-disk table is), and for the module it is also this process's environment, so that
the test's own ``repo.open_store(url)`` reaches the same endpoint.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs

from tests.servers import Server, moto_with_bucket
from tests.test_remote_stores import _env
from tests.test_reuse_rules import SCENARIOS, Base, Scenario, StoreFiles, World, play, prepare

BUCKET = "evalsnap-reuse-rules"
LOCAL_ONLY = frozenset({"versioned_custom_metric", "changed_threshold_deterministic",
                        "changed_evaluator_version", "force_with_reuse"})
IN_THE_BUCKET = [s for s in SCENARIOS if s.name not in LOCAL_ONLY]


@pytest.fixture(scope="module")
def moto_env() -> Iterator[tuple[Server, dict[str, str]]]:
    """A moto bucket, and what a CLI call needs against it (applied to this process too)."""
    with moto_with_bucket(BUCKET) as server, pytest.MonkeyPatch.context() as mp:
        full = _env(AWS_ENDPOINT_URL=server.url)
        needed = {k: v for k, v in full.items() if os.environ.get(k) != v}
        for key in [k for k in os.environ if k not in full]:
            mp.delenv(key)
        for key, value in needed.items():
            mp.setenv(key, value)
        yield server, needed


def s3_store(moto_env: tuple[Server, dict[str, str]], prefix: str) -> StoreFiles:
    server, env = moto_env
    fs = s3fs.S3FileSystem(endpoint_url=server.url, key="testing", secret="testing",
                           client_kwargs={"region_name": "us-east-1"},
                           use_listings_cache=False, skip_instance_cache=True)
    return StoreFiles(f"s3://{BUCKET}/{prefix}", fs, f"{BUCKET}/{prefix}", env)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory,
             moto_env: tuple[Server, dict[str, str]]) -> Base:
    root = tmp_path_factory.mktemp("reuse_rules_s3")
    return prepare(root, s3_store(moto_env, f"prepared-{uuid.uuid4().hex[:8]}"))


@pytest.fixture
def world(prepared: Base, shop_copy: Path, tmp_path: Path,
          moto_env: tuple[Server, dict[str, str]]) -> World:
    source = prepared.store
    store = s3_store(moto_env, f"scenario-{uuid.uuid4().hex[:8]}")
    source.copy_into(store)  # server-side copies, issued concurrently by s3fs
    copied, original = store.files("v1"), source.files("v1")
    assert copied == original, \
        f"expected the scenario's copy of the prepared store to hold the same {len(original)} " \
        f"files, got {len(copied)}"
    return World(prepared, shop_copy, store, tmp_path, env=dict(store.env))


def test_the_bucket_runs_every_scenario_but_the_config_only_ones() -> None:
    assert LOCAL_ONLY <= {s.name for s in SCENARIOS}  # a renamed scenario is not dropped
    assert len(IN_THE_BUCKET) == len(SCENARIOS) - len(LOCAL_ONLY)


@pytest.mark.parametrize("s", IN_THE_BUCKET, ids=[s.name for s in IN_THE_BUCKET])
def test_reuse_rule(world: World, s: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    play(world, s, monkeypatch)
