"""Prefect flows and deployments: wiring only, the work is in `stages/`. The CLI is `cli/`, the servers `services/`."""
