"""Shared base for stored records: versioned, strict, frozen, typed errors on load."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from evalsnap.errors import CorruptRecordError, UnsupportedSchemaVersion

__all__ = ["CorruptRecordError", "StoredModel"]  # CorruptRecordError lives in evalsnap.errors


class StoredModel(BaseModel):
    """A record written to the store. ``schema_version`` comes first in every record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    KIND: ClassVar[str] = "object"
    SCHEMA_VERSION: ClassVar[int] = 1

    def to_bytes(self) -> bytes:
        """The bytes stored: JSON, keys sorted so equal records give equal objects."""
        return json.dumps(
            self.model_dump(mode="json"), sort_keys=True, ensure_ascii=False, allow_nan=False
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "") -> Self:
        """Parses stored bytes; a newer schema raises ``UnsupportedSchemaVersion``."""
        try:
            raw: Any = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptRecordError(
                f"{cls.KIND} {where} is not valid JSON ({exc}); run `evalsnap verify`."
            ) from exc
        return cls.from_data(raw, where=where)

    @classmethod
    def from_data(cls, raw: Any, *, where: str = "") -> Self:
        if isinstance(raw, dict):
            found = raw.get("schema_version", 1)
            if isinstance(found, int) and found > cls.SCHEMA_VERSION:
                raise UnsupportedSchemaVersion(f"{cls.KIND} {where}".strip(), found, cls.SCHEMA_VERSION)
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise CorruptRecordError(
                f"{cls.KIND} {where} does not match schema v{cls.SCHEMA_VERSION}: "
                f"{exc.errors()[0].get('msg')} at {exc.errors()[0].get('loc')}; "
                "run `evalsnap verify` and rerun the command with --force."
            ) from exc
