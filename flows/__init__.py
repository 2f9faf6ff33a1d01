"""Prefect flows, deployments, the CLI and the local services: wiring only, the work is in `stages/`."""
