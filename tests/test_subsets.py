"""A record says whether it covers its whole eval set and config; ``latest`` and the default
baseline skip subsets; the form's parameters (empty = all, comma-separated lists, relative
paths resolved with the resolved path in errors); run names."""

from __future__ import annotations

import json

from evalsnap.records import RunManifest, repo
from tests.test_fail_on_baseline import _run, _small_cold, cli, cold, small  # noqa: F401 - the fixtures

__all__ = ["_small_cold", "cli", "cold", "small"]


def test_subsets_are_marked_and_never_latest(cli, cold, store_dir):  # noqa: F811
    small, full = cold  # the small eval set's cold run, its store copied to store_dir
    assert full.code == 0, full.stderr[-3000:]
    assert full.json["full"] and full.json["coverage"]["missing_cases"] == []
    part = _run(cli, small, store_dir, "--reuse", "--case", "weather_paris", "--metric",
                "response_match_score", "--baseline", "latest", "--json")
    assert part.code == 0, part.stderr[-3000:]
    assert part.json["full"] is False
    assert part.json["coverage"]["missing_cases"] == ["cart_add_two_items", "greeting_then_weather"]
    assert part.json["coverage"]["missing_metrics"] == ["tool_trajectory_avg_score"]
    assert part.json["baseline"]["run_id"] == full.json["run_id"]

    # ls and show say which is which; `latest` is the full run, not the newer subset.
    listed = {r["run_id"]: r["full"] for r in cli("ls", "--store", str(store_dir), "--json").json["runs"]}
    assert listed == {full.json["run_id"]: True, part.json["run_id"]: False}
    table = cli("ls", "--store", str(store_dir)).stdout
    assert "subset" in table and "full" in table
    shown = cli("show", "latest", "--store", str(store_dir), "--json").json
    assert shown["record"]["run_id"] == full.json["run_id"]
    assert "(subset:" in cli("show", part.json["run_id"], "--store", str(store_dir)).stdout

    # The default baseline and a default rescore skip the subset as well.
    again = _run(cli, small, store_dir, "--reuse", "--baseline", "latest", "--json")
    assert again.json["baseline"]["run_id"] == full.json["run_id"]
    rescored = cli("rescore", "latest", "--store", str(store_dir), "--config", str(small["config"]),
                   "--reuse", "--json")
    assert rescored.code == 0, rescored.stderr[-3000:]
    assert rescored.json["full"] is True and len(rescored.json["cases"]) == 3
    # A rescore of the subset is a subset too, though it selects nothing itself.
    of_part = cli("rescore", part.json["run_id"], "--store", str(store_dir), "--reuse", "--json")
    assert of_part.json["full"] is False and of_part.json["coverage"]["note"]


def test_manifest_written_before_coverage_still_reads_as_full(tmp_path):
    store = repo.open_store(str(tmp_path / "store"))
    old = RunManifest(run_id="r-old", eval_set_id="s", app_name="a", record_oid="sha256:" + "1" * 64,
                      snapshot_oid=None, objects=[], passed=True, complete=True,
                      created_at="2026-01-01T00:00:00Z")
    repo.write_manifest(store, old)
    raw = json.loads(store.get_ref("runs", "r-old"))
    assert "full" not in raw  # the bytes an older evalsnap wrote, checksum and all
    assert repo.read_manifest(store, "r-old").full is None
    assert repo.latest_manifest(store).run_id == "r-old"
    newer = old.model_copy(update={"run_id": "r-new", "created_at": "2026-02-01T00:00:00Z",
                                   "full": False})
    repo.write_manifest(store, newer)
    assert repo.latest_manifest(store).run_id == "r-old"  # the newer one is a subset
    assert repo.latest_manifest(store, eval_set_id="s", exclude_run="r-old") is not None
    assert repo.latest_manifest(store, eval_set_id="s", exclude_run="r-old", fallback=False) is None


def test_form_defaults_and_relative_paths(cli, small, store_dir, tmp_path, monkeypatch):  # noqa: F811
    from tasks.support import absolute_evalset, names

    assert names("") is None and names(" a, b ,") == ["a", "b"]
    with monkeypatch.context() as m:
        m.chdir(small["agent"].parent)
        assert absolute_evalset("shop_agent/small.evalset.json:weather_paris") == \
            f"{small['agent']}/small.evalset.json:weather_paris"
        assert absolute_evalset("small") == "small"  # an eval set id of the agent
    # A relative path that does not exist: the error names the resolved path.
    missing = cli("run", "no_such_agent", "x.evalset.json", "--store", str(store_dir),
                  cwd=tmp_path)
    assert missing.code == 2
    assert str(tmp_path / "no_such_agent") in missing.stderr.replace("\n", "")
    # The Python API keeps lists and None: they become the form's comma-separated text and "".
    import evalsnap

    result = evalsnap.evaluate(str(small["agent"]), str(small["evalset"]), config=str(small["config"]),
                               store=str(store_dir), metrics=["response_match_score"],
                               cases=["weather_paris", "cart_add_two_items"], agent_name=None)
    assert {c.eval_id for c in result.runs[0].cases} == {"weather_paris", "cart_add_two_items"}
    assert set(result.runs[0].cases[0].metrics) == {"response_match_score"}


def test_typed_and_generated_run_names():
    from tasks.support import GENERATED_NAME, generated_name, typed_name

    for random_name in ("clever-otter", "nu5-xultun", "omega5-enedwaith-f"):
        assert not typed_name(random_name), random_name
    for person in ("after the reference fix", "Nightly rerun", "fix #12"):
        assert typed_name(person), person
    a, b = generated_name("shop", True), generated_name("shop", True)
    assert a != b and a.startswith("shop-full-") and GENERATED_NAME.search(a)
    assert generated_name("shop", False).startswith("shop-subset-")
    assert not typed_name(a)
