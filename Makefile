# Every target creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Independent tests run in parallel; most of them wait on sockets and subprocesses. Workers
# steal queued tests from each other, so a few long tests do not leave the end to one worker.
PYTEST_WORKERS ?= 6

.PHONY: run test test-fast lint fmt bench soak clean image image-test

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Herald needs Python >= 3.11"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# `make run CONFIG=herald.yaml` (or HERALD_CONFIG=herald.yaml make run) reads a config file.
run: $(STAMP)
	$(BIN)/herald run $(if $(CONFIG),--config $(CONFIG))

test: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Unit and contract tests only (no daemon subprocesses, no integration rigs): the quick check.
test-fast: $(STAMP)
	$(BIN)/pytest -n auto -m "not e2e" tests/unit tests/contract $(PYTEST_ARGS)

# The container image (Containerfile), with podman when installed, else docker:
# `make image IMAGE=herald:0.1.0`; BASE=<image> builds on another Python base; the
# certificate bundle in PIP_CERT, when set, is what pip trusts in the build too (a proxy).
ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
IMAGE  ?= herald:latest
comma  := ,
image:
	$(ENGINE) build $(if $(filter podman,$(ENGINE)),--format docker) \
		$(if $(BASE),--build-arg BASE=$(BASE)) $(if $(PIP_CERT),--secret id=pip_cert$(comma)src=$(PIP_CERT)) \
		-t $(IMAGE) -f Containerfile .

# Builds the image on a Debian base made locally (mmdebstrap) and runs it with podman
# (tests/image): health, an answer, SIGTERM, restarts on SQLite and PostgreSQL, non-root.
# Not part of `make test`; the base and the built image stay as the next run's cache.
image-test: $(STAMP)
	HERALD_IMAGE_TEST=1 $(BIN)/pytest -p no:cacheprovider -ra tests/image $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Benchmarks (measurements, not tests): bench/results/<date>.{json,md} and PNG plots.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# Chaos, measured: every platform at once, random faults, 20 SIGKILLs, 5,000 messages;
# the report goes to bench/results/<date>-soak.{json,md} (SOAK_ARGS="--messages 500 --kills 5").
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
