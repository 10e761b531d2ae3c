"""Records hold no environment variables, credentials or HTTP headers."""

from __future__ import annotations

import json
from pathlib import Path

from tests._cli import run_inproc

SECRET_HEADER = "x-goog-api-key-SECRETVALUE-123"
SECRET_ENV = "AKIAFAKESECRETENVVALUE42"


def test_store_contains_no_credentials_headers_or_env(tmp_path: Path, shop_copy: Path):
    config = {
        "criteria": {
            "response_match_score": 0.5,
            "final_response_match_v2": {
                "threshold": 0.5,
                "judgeModelOptions": {
                    "judgeModel": "offline-judge-v1", "numSamples": 1,
                    "judgeModelConfig": {"httpOptions": {
                        "headers": {"x-goog-api-key": SECRET_HEADER},
                        "baseUrl": "http://127.0.0.1:9/secret-endpoint"}}}}}}
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(config))
    store = tmp_path / "store"
    result = run_inproc("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--config",
                     str(cfg), "--store", str(store), "--case", "weather_paris", "--case",
                     "cart_add_two_items", "--json",
                     env={"AWS_SECRET_ACCESS_KEY": SECRET_ENV, "GOOGLE_API_KEY": SECRET_ENV})
    assert result.code in (0, 1), result.stderr[-3000:]
    assert result.json["judge_calls"] == 2  # the judge really ran with that config
    files = [f for f in store.rglob("*") if f.is_file()]
    # the judge ledger entries (in the scoring task's pack) are among the files searched
    assert any("/objects/pack/" in str(f) and b'"kind":"judge"' in f.read_bytes() for f in files)
    for f in files:
        data = f.read_bytes()
        for secret in (SECRET_HEADER, SECRET_ENV, "secret-endpoint"):
            assert secret.encode() not in data, f"{secret} leaked into {f}"
