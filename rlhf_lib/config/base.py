"""The base of every config section: unknown keys, wrong types and non-finite numbers are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config that cannot be used; the message names each bad key and what it expected."""


class Section(BaseModel):
    # No inf or nan in any number: `sft.lr=.inf` would pass `gt=0` and train to nan.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# Our column names that a `data.*_columns` mapping may point at the user's columns.
