"""Every ``EVALSNAP_*`` setting, in one pydantic-settings model read once per process.

The README's "Settings" table is this class. Values come from the environment (a work
pool's job variables set them for deployed runs); command-line options and flow
parameters, where they exist, win over them. :func:`get` reads the environment the first
time it is called; :func:`reload` reads it again (tests that change a variable).
"""

from __future__ import annotations

import functools
import os
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

TaskRunnerName = Literal["threads", "dask"]


class Settings(BaseSettings):
    """evalsnap's settings (environment variable = ``EVALSNAP_`` + the field name, upper case)."""

    model_config = SettingsConfigDict(env_prefix="EVALSNAP_", extra="ignore",
                                      validate_default=True)

    store: str = Field(".evalsnap", description="Store URL when --store is not given")
    task_runner: TaskRunnerName | None = Field(
        None, description="threads (default) or dask, when --task-runner is not given")
    dask_address: str | None = Field(
        None, description="An existing Dask scheduler (implies dask)")
    dask_workers: int | None = Field(
        None, ge=1, description="Worker processes of a local Dask cluster (default: Dask's)")
    max_workers: int = Field(8, ge=1, description="Threads of the default task runner")
    cpu_slots: int | None = Field(
        None, ge=1, description="Inference batches running at once per process (default: cores)")
    infer_batch: int | None = Field(
        None, ge=1, description="Cases per inference task (default: about one batch per worker, "
                                "at most 50)")
    score_processes: int | None = Field(
        None, ge=0, description="Scoring processes beside the flow's (Prefect's "
                                "ProcessPoolTaskRunner) for a run that scores; default: 1 on two "
                                "or more cores, else 0")
    score_pool_min_units: int = Field(
        200, ge=0, description="Units a run must score before it starts a scoring process")
    agent_concurrency: int = Field(
        64, ge=1, description="Agent model calls in flight per process")
    judge_concurrency: int = Field(
        8, ge=1, description="Judge model calls in flight per process")
    agent_concurrency_limit: str = Field(
        "evalsnap-agent-model",
        description="Prefect global concurrency limit for agent calls, used if it exists "
                    "(\"off\" disables)")
    judge_concurrency_limit: str = Field(
        "evalsnap-judge-model",
        description="Prefect global concurrency limit for judge calls, used if it exists "
                    "(\"off\" disables)")
    retry_delays: Annotated[list[float], NoDecode] = Field(
        [1.0, 4.0], description="Seconds between retries of a failed model call or inference, "
                                "comma-separated")
    retries: int | None = Field(
        None, ge=0, description="Retries of an inference task (default: one per retry delay)")
    agent_call_timeout: float = Field(
        120.0, gt=0, description="Seconds one agent model call may take; past it the case's "
                                 "inference fails (and is retried as failed inferences are)")
    inference_timeout: float = Field(
        900.0, gt=0, description="Seconds the whole inference of one case may take (every "
                                 "turn, tool and model call)")
    judge_call_timeout: float = Field(
        120.0, gt=0, description="Seconds one judge model call may take; past it the call "
                                 "is retried, then the unit is NOT_EVALUATED")
    metric_timeout: float = Field(
        600.0, gt=0, description="Seconds one unit (one metric on one case, judge retries "
                                 "included) may take; per metric: `evalsnapTimeouts` in the "
                                 "config")
    store_timeout: float = Field(
        10.0, gt=0, description="Seconds one small store call may take (transfers and "
                                "listings get more); Prefect's result storage uses the store")
    public_url: str | None = Field(
        None, description="The HTTP base the store is served at (a bucket website, a CDN, "
                          "https://storage.googleapis.com/<bucket>/<prefix>): report links "
                          "in artifacts, events and --json open there; unset: a URL the "
                          "backend signs (S3, GCS with signing credentials), else the store URL")
    link_expiry: int = Field(
        7 * 24 * 3600, ge=60, le=7 * 24 * 3600,
        description="Seconds a signed report link stays valid (at most 7 days, S3's limit)")
    report_detail_cases: int = Field(
        200, ge=0, description="Cases whose conversation, invocation rows and judge ledger "
                               "a run's HTML page shows (regressed, failed and incomplete "
                               "first); every other case is a row of scores, its details in "
                               "`evalsnap show RUN --json`: the page stays small at any size")
    user: str | None = Field(
        None, description="Who accepts or pins a run (`evalsnap accept`, `pin`), as recorded "
                          "in the store; default: the operating system's user name")
    lazy_imports: bool = Field(
        True, description="Defer ADK's heavy optional imports (Vertex SDK, pandas, nltk) "
                          "until a metric uses them")

    @field_validator("retry_delays", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [float(x) for x in value.split(",") if x.strip()]
        return value

    @field_validator("task_runner", "dask_address", "infer_batch", "cpu_slots", "dask_workers",
                     "retries", "score_processes", "user", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def task_retries(self) -> int:
        return len(self.retry_delays) if self.retries is None else self.retries

    @property
    def scoring_process_count(self) -> int:
        if self.score_processes is not None:
            return self.score_processes
        return 1 if (os.cpu_count() or 1) >= 2 else 0

    @property
    def cpu_slot_count(self) -> int:
        return self.cpu_slots or os.cpu_count() or 1

    def limit_name(self, kind: Literal["agent", "judge"]) -> str | None:
        """The Prefect global concurrency limit for ``kind``'s calls, or None (switched off)."""
        value = (self.agent_concurrency_limit if kind == "agent"
                 else self.judge_concurrency_limit).strip()
        return None if value.lower() in ("", "off", "none") else value


@functools.cache
def get() -> Settings:
    """The process's settings, read from the environment once; a bad value is a
    :class:`~evalsnap.errors.UsageError` naming the variable."""
    from pydantic import ValidationError

    try:
        return Settings()  # type: ignore[call-arg]  # every field has a default
    except ValidationError as exc:
        from evalsnap.errors import UsageError

        bad = "; ".join(f"EVALSNAP_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
                        for e in exc.errors())
        raise UsageError(f"invalid setting {bad}; fix or unset the variable.") from None


def reload() -> Settings:
    """Reads the environment again (for tests that change a variable)."""
    get.cache_clear()
    return get()
