"""User preference data (local files, folders or hub data sets, e.g. Anthropic's HH-RLHF) as a task: read and
validated by `rlhf_lib.data.user`, behind the task protocol in `task.py`."""
