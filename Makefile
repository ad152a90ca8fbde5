# The two commands a user needs: `make demo` and `make test`. Everything else supports them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SJ     := $(BIN)/stream-jobs
# mkdocs-material prints a banner about its own future on every build; it says nothing
# about this site.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

.PHONY: setup system venv stack down status lint docs manual unit integration test demo demo-serve screenshots \
	bench clean chaos toxiproxy \
	docker-images docker-test docker-check compose-check

setup: system venv

system:
	@bash ops/setup-system.sh

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

stack: setup
	$(SJ) dev up

down:
	-$(SJ) dev down
	-@bash ops/docker/engine.sh stop

status:
	$(SJ) dev status

# ruff, mypy (strict, the docs' generators too), the layer contract, and the manual built
# with --strict: an upward import, a broken link or a missing page fails here. (Not
# `mkdocs build -q`: quiet drops the warnings before --strict can count them.)
lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy docs/hooks
	$(BIN)/lint-imports
	$(MKDOCS) build --strict -d site

# The manual (mkdocs.yml, docs/, and the parts generated from the code): site/index.html.
docs: venv
	$(MKDOCS) build --strict -d site

# The unit tests: the library's (tests/unit) and ops/' benches, fault trials and deploy
# files (tests/ops); no services.
unit: venv
	$(BIN)/pytest -q tests/unit tests/ops

# The manual alone, on the stack: every block of README.md and docs/ (`make integration`
# runs it too). PAGES=docs/results.md make manual: one page.
PAGES ?= README.md docs

manual: stack
	$(BIN)/pytest -q $(PAGES)

# Two test processes at once: every test has its own topic prefix, groups and schema, and
# most of a test's time is waiting on the broker. The manual runs with them, a page per
# process at a time (README.md and docs/: tests/docs/). The tests that restart a shared
# service (marked `exclusive`) run afterwards, alone.
INTEGRATION_PROCESSES ?= 2

integration: stack toxiproxy
	$(BIN)/pytest -q -n $(INTEGRATION_PROCESSES) --dist loadfile -m "not exclusive" \
	  tests/integration README.md docs
	$(BIN)/pytest -q -m exclusive tests/integration

# lint, then the unit tests (no services), then the integration tests on the real stack,
# then the Docker checks (below).
test: setup lint unit integration docker-test

# Docker: ops/docker/engine.sh finds an engine, or (as root) installs Debian's docker.io and
# starts one with its data in ~/.cache/stream-jobs/docker; it prints DOCKER_HOST and
# testcontainers' settings. ops/docker/images.py builds the local stand-ins for the images
# the project names (no registry is reachable here), once per machine.
DOCKER_ENV = bash ops/docker/engine.sh env

docker-images: venv
	@env $$($(DOCKER_ENV)) $(BIN)/python -m ops.docker.images

# docker-compose.yml for real: up, enqueue from the host, the jobs done, down (~1 min warm).
compose-check: docker-images
	@env $$($(DOCKER_ENV)) $(BIN)/python -m ops.docker.compose_check

# `make test`'s Docker part: the fixture tests on the testcontainers backend (the Kafka and
# Postgres stand-ins only). Without a Docker engine they skip, saying why (pytest exits 0).
docker-test: venv
	@if dockerenv=$$($(DOCKER_ENV)); then \
	  env $$dockerenv $(BIN)/python -m ops.docker.images base kafka postgres && \
	  env $$dockerenv STREAM_JOBS_TEST_BACKEND=testcontainers \
	    $(BIN)/pytest -q -rs tests/integration/test_stack_fixtures.py; \
	else \
	  echo "no Docker engine (see above): the testcontainers tests skip"; \
	  STREAM_JOBS_TEST_BACKEND=testcontainers $(BIN)/pytest -q -rs tests/integration/test_stack_fixtures.py; \
	fi

# The Docker files for real (~3 min warm, outside `make test` to keep CI short): the fixture
# tests on testcontainers, the deploy image running a worker, and the compose check.
docker-check: docker-test docker-images
	@env $$($(DOCKER_ENV)) STREAM_JOBS_TEST_BACKEND=testcontainers $(BIN)/pytest -q -rs tests/docker
	@env $$($(DOCKER_ENV)) $(BIN)/python -m ops.docker.compose_check

demo: stack
	$(SJ) demo

# The dashboard's browser tests, keeping their screenshots (1280 and 390 px wide) in
# docs/img/, the pictures docs/operating/dashboard.md shows: run after a page changes.
screenshots: stack
	STREAM_JOBS_SCREENSHOTS=docs/img $(BIN)/pytest -q tests/integration/test_gateway_served.py \
	  tests/integration/test_pages_*.py

# The dashboard on the last demo run (its prefix, schema and declarations, from
# .stack/demo.env), open without a token on http://127.0.0.1:8080/.
demo-serve:
	@env=$${STREAM_JOBS_STACK_DIR:-.stack}/demo.env; test -f $$env || { echo "no $$env: run make demo first"; exit 1; }; \
	. $$env && exec $(SJ) serve --no-auth

# Benchmarks against Kafka's tools, raw aiokafka, Celery and Dramatiq: ops/bench/RESULTS.md
# (~30 min, the scaling run included). Not part of `make test`. BENCH_QUICK=1 make bench: a
# smoke run, under 3 min. BENCH_ONLY=scaling make bench: one section.
bench: stack $(VENV)/.bench-installed
	$(BIN)/python -m ops.bench.run

# Toxiproxy, the TCP fault proxy of the network fault tests and of make chaos, built at a
# pinned version into .stack/toxiproxy/ (ops/toxiproxy/build.sh; once per machine, ~30 s).
toxiproxy:
	@bash ops/toxiproxy/build.sh >/dev/null

# Fault injection, every scenario and trial 3 times (~2 h): real worker processes under
# kill -9, SIGSTOP, broker kills and pauses on a 3-node cluster, Postgres restarts and
# outages, refused retry writes, rolling restarts and rebalance storms; the network
# between the workers and Kafka or Postgres slowed, blackholed, reset and squeezed through
# Toxiproxy, and the LISTEN connections silenced; then the scheduler
# leader killed and frozen, a batch's callbacks through kill -9, cancels racing runs, the
# outbox through a Kafka outage and its relays killed, fair queues, kept results, unique
# keys raced and the history's counts through kill -9. Writes ops/chaos/RESULTS.md.
# CHAOS_JOBS=N jobs per run, CHAOS_RUNS=R runs each, CHAOS_ONLY=kill9,cancels,... a subset
# (docs/faults/index.md).
chaos: stack toxiproxy
	$(BIN)/python -m ops.chaos.run

$(VENV)/.bench-installed: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev,bench]'
	@touch $@

clean: down
	rm -rf .stack
