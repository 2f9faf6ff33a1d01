# The two commands a user needs: `make demo` and `make test`. Both install into .venv first when needed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test up down bench clean

setup: $(STAMP)

# The lock pins torch==2.13.0, whose CPU build pip takes from local disk; anything newer pulls a CUDA build.
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: setup
	$(BIN)/rlhf demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/rlhf bench

up: setup
	$(BIN)/rlhf up

down:
	test ! -x $(BIN)/rlhf || $(BIN)/rlhf down

clean: down
	rm -rf .rlhf
