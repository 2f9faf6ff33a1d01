"""The local services the pipeline talks to, as processes: the Prefect and MLflow servers (`rlhf up`), PostgreSQL and
an S3 server for the shared-store layout, the ephemeral Prefect server of `rlhf run`, and the reward model served
over HTTP (`rlhf serve-reward`)."""
