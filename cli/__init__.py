"""The `rlhf` command: argument parsing, the console output, the error messages and the commands' glue. It starts
flows (`flows`), services (`services`) and benchmarks (`benchmarks`); nothing imports it."""
