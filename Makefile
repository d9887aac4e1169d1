# The two commands of README.md: `make run` and `make test`. Both work on a fresh machine with
# python3 (3.11+); they create .venv and install the pinned requirements first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test test-fast bench check-board contract-check

# `make run`'s recipes are silent (@): its output is the server's start-up banner (URL, login,
# docs), which must not scroll away among echoed commands and migration lines.
$(PY):
	@echo "Creating $(VENV) ..."
	@$(PYTHON) -m venv $(VENV)

$(VENV)/.run-deps: requirements.txt | $(PY)
	@echo "Installing the pinned requirements into $(VENV) ..."
	@$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $@

$(VENV)/.test-deps: requirements.txt requirements-test.txt | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $@ $(VENV)/.run-deps

# The board on the embedded default (SQLite file db.sqlite3) unless DATABASE_URL says otherwise:
# one uvicorn worker process per core on one address (API, admin, board page and websocket),
# with the reaper beside them so that lost leases come back by themselves. DEBUG defaults to 1
# here (local use), and the checkout is marked (.taskflow-dev) so that `.venv/bin/python
# manage.py ...` gets the same settings; set DEBUG=0 and SECRET_KEY for anything else.
# Migrations run quietly; `serve --ensure-admin` creates the first administrator when there is
# no user and shows its password once, in the banner it prints when the server answers.
run: $(VENV)/.run-deps
	@export DEBUG=$${DEBUG-1}; \
	case "$$DEBUG" in 1|true|yes|on) touch .taskflow-dev;; *) rm -f .taskflow-dev;; esac; \
	$(PY) manage.py migrate --noinput -v 0 && \
	exec $(PY) manage.py serve --host $(HOST) --port $(PORT) --ensure-admin

# The whole suite, in two pytest sessions: the SQL stores (SQLite, and PostgreSQL when the server
# at TEST_POSTGRES_URL answers), then MongoDB (tests/mongodb: a SecantusDB server started for the
# run, or the replica set at TEST_MONGO_URL). A missing server's tests are skipped with a NOT RUN
# line (and fail when CI=true). PYTEST_ARGS go to the first session, MONGODB_PYTEST_ARGS to the
# second. Each session runs on TEST_WORKERS pytest-xdist worker processes (one per core, at most
# 4; TEST_WORKERS=0 runs in this process): most tests spend their time waiting on real servers,
# so workers overlap well even on two cores. Every worker has its own test databases.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
# worksteal: a worker that has run out of tests takes pending ones from the other, so a session
# does not end with one worker idle while the other still holds a queue of long races.
DIST ?= --dist worksteal
# The tests marked `timing` assert a latency: they run after the first session, one at a time
# with nothing else running (another worker's load decided them in CI). Exit code 5 is "none of
# PYTEST_ARGS's tests is marked timing".
test: $(VENV)/.test-deps
	$(PY) -m pytest -n $(TEST_WORKERS) $(DIST) -m "not timing" $(PYTEST_ARGS)
	$(PY) -m pytest -p no:xdist -m timing $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -n $(TEST_WORKERS) $(DIST) --ds=tests.mongodb_settings tests/mongodb $(MONGODB_PYTEST_ARGS)

# The developers' lane (a few minutes): the first session without the tests pytest.ini marks
# `browser`, `server` (a real `manage.py serve`, set by tests/conftest.py) and `slow`; SQLite and
# PostgreSQL still run, MongoDB's session does not. `make test` stays the whole suite (CI).
test-fast: $(VENV)/.test-deps
	$(PY) -m pytest -n $(TEST_WORKERS) $(DIST) -m "not browser and not server and not slow" $(PYTEST_ARGS)

bench: $(VENV)/.test-deps
	$(PY) bench/claims.py

check-board: $(VENV)/.run-deps
	DEBUG=$${DEBUG-1} $(PY) manage.py check_board

contract-check: $(VENV)/.run-deps
	DEBUG=$${DEBUG-1} $(PY) manage.py contract_check
