"""A base for the configuration models: YAML's true/false is never read as a number, nor .inf / .nan as a value.

Pydantic's lax mode reads a bool as 1 or 0 for an int or float field, so `tokens: true` in a sweep file became a
budget of one token and was reported as something else entirely. Every other lax reading stays (a YAML string
such as `1e-3` still reads as a float)."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


# The largest seed every generator a job seeds takes (torch, numpy, Python's random), with room for offsets: the
# bound of a sweep's `seeds:` and of train.seed.
MAX_SEED = 2**63 - 1


def _numeric(annotation: Any) -> bool:
    """Whether a field takes numbers and not bools (int, float, or a union of them with None or literals)."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return bool not in args and any(a in (int, float) for a in args)


class NumbersNotBools(BaseModel):
    # an infinite learning rate or weight decay trained a run of skipped steps to a NaN model that ended "finished"
    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _numeric(field.annotation):
            raise ValueError(f"{str(value).lower()} is not a number; give a number")
        return value
