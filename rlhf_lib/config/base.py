"""The base of every config section: unknown keys, wrong types and non-finite numbers are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_serializer

from rlhf_lib.redaction import redact_tree


KEEP_SECRETS = "keep_secrets"


class ConfigError(ValueError):
    """A config that cannot be used; the message names each bad key and what it expected."""


class Section(BaseModel):
    # No inf or nan in any number: `sft.lr=.inf` would pass `gt=0` and train to nan.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_serializer(mode="wrap", when_used="json")
    def _redacted(self, handler, info):
        """JSON dumps (Prefect's flow parameters, the config artifact, deployments) carry no secret-shaped text
        (`rlhf_lib.redaction`); Python dumps (cache keys) keep the values, and so does a JSON dump with
        `context={KEEP_SECRETS: True}` (the job file of this stage's own launched processes)."""
        if info.context and info.context.get(KEEP_SECRETS):
            return handler(self)
        return redact_tree(handler(self), by_key=False)


# Our column names that a `data.*_columns` mapping may point at the user's columns.
