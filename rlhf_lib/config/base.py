"""The base of every config section: unknown keys and wrong types are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# Our column names that a `data.*_columns` mapping may point at the user's columns.
