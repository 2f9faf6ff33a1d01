# The two commands a user needs: `make demo` and `make test`. Both install into .venv first when needed. `make test` is
# CI's suite; `make test-all` adds the tests marked `slow` (pyproject.toml): the environment checks that start a
# Postgres/S3 stack, work-pool workers, two CLI processes as two nodes, a browser, or the GPU script on the CPU.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export TOKENIZERS_PARALLELISM := false
# The tests and the demo never need the hub: offline, a stray hub call fails at once instead of waiting on a network.
# Not for `up`: its services serve hub runs. `make demo` starts those same services, which outlive it, so the marker
# names the switch that is ours and the services drop it (services/servers.py, `inherited_offline`; the demo's own
# flow, run by them, makes no hub call). A switch the user set is theirs: then make sets neither.
ifndef HF_HUB_OFFLINE
test test-all demo: export HF_HUB_OFFLINE := 1
demo: export RLHF_OFFLINE_FROM_MAKE := HF_HUB_OFFLINE
endif

.PHONY: setup demo test test-all up down bench clean

setup: $(STAMP)

# The lock pins torch==2.13.0, whose CPU build pip takes from local disk; anything newer pulls a CUDA build.
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: setup
	$(BIN)/rlhf demo

# Two worker processes, each test file whole on one of them (its module fixtures and its order kept): the suite is
# mostly single-threaded waits (process starts, imports, servers), so two workers fill the two cores CI has.
test: setup
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadfile --durations=25

test-all: setup
	$(BIN)/python -m pytest -q --durations=25

bench: setup
	$(BIN)/rlhf bench

up: setup
	$(BIN)/rlhf up

down:
	test ! -x $(BIN)/rlhf || $(BIN)/rlhf down

clean: down
	rm -rf .rlhf
