# The product's front door. Every target installs what it needs itself.
.DEFAULT_GOAL := help
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: help setup test test-unit

help:
	@echo "make test       install everything needed (apt, .venv, embedded broker) and run the test suite"
	@echo "make test-unit  only the pure-logic unit tests"

setup:
	@bash scripts/bootstrap.sh

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)
