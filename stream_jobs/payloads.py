"""Payloads: a job's value as JSON bytes, and a payload model's complaint in one line. Pure.

The value of a job record is the user's payload as JSON (orjson), readable by any Kafka
tool. Pydantic models are written as `model_dump(mode="json")`.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from stream_jobs.errors import PayloadError


def encode_payload(obj: object, *, max_bytes: int | None = None) -> bytes:
    """`obj` as JSON bytes: a dict, a list, a pydantic model, or any JSON value.

    Pydantic models (also nested ones) are written as `model_dump(mode="json")`.
    Raises `PayloadError` for anything JSON cannot hold (bytes, sets, non-string keys,
    integers beyond 64 bits) or, given `max_bytes`, for a payload larger than that.
    """
    try:
        value = _model_json(obj) if isinstance(obj, BaseModel) else obj
        data = orjson.dumps(value, default=_nested)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"The payload cannot be written as JSON ({exc}); "
            "pass a dict, a list or a pydantic model of JSON values."
        ) from exc
    if max_bytes is not None and len(data) > max_bytes:
        raise PayloadError(
            f"The payload is {len(data)} bytes as JSON, over the limit of {max_bytes}; "
            "store large data elsewhere and enqueue a reference to it."
        )
    return data


def _model_json(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


def _nested(obj: object) -> Any:
    if isinstance(obj, BaseModel):
        return _model_json(obj)
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def validation_summary(exc: ValidationError, limit: int = 5) -> str:
    """The first `limit` problems a model found, as `field: message; ...`. Never the
    input: pydantic's own text quotes it, and payloads stay out of headers and logs."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}"
                     for err in exc.errors()[:limit])
