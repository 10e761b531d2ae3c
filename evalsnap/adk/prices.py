"""``evalsnapPrices`` in test_config.json: model prices for a run's estimated cost (not a
scoring rule: no fingerprint reads it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalsnap.errors import ConfigError
from evalsnap.records.record import ModelPrice

__all__ = ["read_prices"]


class _PriceEntry(BaseModel):
    """One ``evalsnapPrices`` entry as written in test_config.json."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input_per_million: float = Field(alias="inputPerMillion", ge=0, allow_inf_nan=False)
    output_per_million: float = Field(alias="outputPerMillion", ge=0, allow_inf_nan=False)


_PRICES_FORMAT = ('"evalsnapPrices": {"<model name>": {"inputPerMillion": 0.3, '
                  '"outputPerMillion": 2.5}}: price per million input and output tokens, '
                  'numbers >= 0, one entry per model name as the model reports it')


def read_prices(raw: dict[str, Any], where: str) -> dict[str, ModelPrice] | None:
    """The optional ``evalsnapPrices`` table; a malformed one is a ConfigError."""
    table = raw.get("evalsnapPrices")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: `evalsnapPrices` must be an object, as in {_PRICES_FORMAT}.")
    prices = {}
    for model, entry in table.items():
        if not model.strip():
            raise ConfigError(f"{where}: `evalsnapPrices` has an empty model name; name each "
                              f"model as in {_PRICES_FORMAT}.")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: `evalsnapPrices.{model}` must be an object with "
                              f"inputPerMillion and outputPerMillion, as in {_PRICES_FORMAT}.")
        try:
            parsed = _PriceEntry.model_validate(entry)
        except ValidationError as exc:
            problems = "; ".join(
                f"`{'.'.join(str(p) for p in ('evalsnapPrices', model, *err['loc']))}`: "
                f"{err['msg']}" for err in exc.errors())
            raise ConfigError(f"{where}: the price table is malformed ({problems}). Write "
                              f"{_PRICES_FORMAT}; or remove the key (it only prices the "
                              "run's tokens).") from exc
        prices[model] = ModelPrice(input_per_million=parsed.input_per_million,
                                   output_per_million=parsed.output_per_million)
    return prices
