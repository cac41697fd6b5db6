# Everything installs into .venv, the project's own virtual environment, at the
# versions requirements.lock pins: every distribution, direct or transitive, pip
# and the build backend included, so a fresh machine runs what CI ran. torch is
# pinned there as 2.13.0 (from constraints.txt): an unpinned torch on a CPU
# machine would download gigabytes of CUDA packages.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOCK := requirements.lock
PIP := $(BIN)/python -m pip install --constraint $(LOCK)
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Every extra, so one lock serves `make install` and `make bench` alike.
EXTRAS := dev,plot,export,atari,video,games,trading,box2d,bench
INSTALL_EXTRAS := dev,plot,export,atari,video,games,trading

# The benchmarks run with -m (and type-checked); every other bench/*.py is a script.
BENCH_MODULES := bench.federation bench.federation_sim bench.population
BENCH_SCRIPTS := $(filter-out bench/__init__.py bench/federation_sim.py,$(wildcard bench/*.py))

.PHONY: install lock browser postgres test test-all proto proto-check lint fmt typecheck bench bench-gpu wheelhouse demo clean

install: $(STAMP)

# The build backend comes from the lock too (--no-build-isolation): an isolated
# build would fetch whatever setuptools is newest that day.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) pip setuptools wheel
	$(PIP) --no-build-isolation -e '.[$(INSTALL_EXTRAS)]'
	touch $(STAMP)

# Regenerates requirements.lock from pyproject.toml and constraints.txt, keeping
# the pins that still satisfy them; `make lock UPGRADE=1` moves every pin to the
# newest release allowed. pip-compile records the CPU build's local label
# (2.13.0+cpu), which only this kind of machine's wheel folder has; the plain
# version matches that build here and the registry's elsewhere. The bench extra
# names fedrl[box2d], which pip-compile writes as a pin of this very checkout's
# path: the project is installed from its tree, never from the lock.
lock: install
	$(BIN)/pip-compile --quiet --no-build-isolation --strip-extras --allow-unsafe --no-emit-index-url \
		--no-emit-find-links --constraint constraints.txt --extra $(EXTRAS) \
		$(if $(UPGRADE),--upgrade) --output-file $(LOCK) pyproject.toml
	sed -i -E -e 's/^(torch==[0-9.]+)\+[a-z0-9]+$$/\1/' -e '/^fedrl @ /d' $(LOCK)

# $(call apt_packages,PACKAGES,PRESENT,WHO): nothing when the shell test PRESENT
# passes; otherwise Debian's PACKAGES, installed where this runs as root with
# apt-get (updating the package lists once if the install fails); elsewhere a
# note that WHO will skip, and says why.
APT_GET := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq
define apt_packages
	@if $(2); then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing $(1) for $(3)"; \
		$(APT_GET) $(1) >/dev/null || { apt-get update -qq && $(APT_GET) $(1) >/dev/null; } \
		|| echo "note: apt-get could not install $(1): $(3) will skip"; \
	else \
		echo "note: no $(1), and installing them needs root and apt-get: $(3) will skip"; \
	fi
endef

# The dashboard's browser test drives Debian's headless Chromium through its
# chromedriver (tests/test_dashboard_browser.py); a CJK font lets its
# screenshot show ids such as 李雷.
BROWSER_PACKAGES := chromium chromium-driver fonts-wqy-microhei
browser:
	$(call apt_packages,$(BROWSER_PACKAGES),command -v chromium >/dev/null && command -v chromedriver >/dev/null,the dashboard's browser test)

# The trading env's PostgreSQL tests start a throwaway server of their own
# (tests/support/postgres.py: initdb into a temp dir, pg_ctl on a free port), from
# Debian's postgresql package, whose programs live in /usr/lib/postgresql/*/bin.
# Installing the package may set up a system cluster: the tests never use it.
POSTGRES_PACKAGES := postgresql
postgres:
	$(call apt_packages,$(POSTGRES_PACKAGES),ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null,the trading env's PostgreSQL tests)

# The default tests run whole test files in parallel, one process per core and
# one more (four at most): files keep their module-scoped servers to themselves,
# and most tests spend part of their time waiting on real servers and
# subprocesses, which the extra process fills. The slow ones (learning, crash
# scenarios) each keep every core busy and run one at a time.
TEST_PROCESSES := $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 3 ? n + 1 : 4 )))
PYTEST_WORKERS ?= -n $(TEST_PROCESSES) --dist loadfile
# The tests start hundreds of Python processes (servers, clients, actors); with
# PYTHONDONTWRITEBYTECODE set (some images set it) each would compile the
# project's sources again, an eighth more CPU on the heaviest files. The caches
# go to the git-ignored __pycache__ folders.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
test: install browser postgres
	$(PYTEST) $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-all: install browser postgres
	$(PYTEST) -m '' $(PYTEST_ARGS)

proto: install
	$(BIN)/python proto/generate.py

proto-check: install
	$(BIN)/python proto/generate.py --check

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# mypy cannot follow setuptools' editable import hook, so it reads the code
# through a farm of links laid out as installed (fedrl/server -> server/ ...).
TYPECHECK_DIR := build/typecheck
typecheck: install
	rm -rf $(TYPECHECK_DIR) && mkdir -p $(TYPECHECK_DIR)/fedrl
	for d in server client common envs; do ln -s ../../../$$d $(TYPECHECK_DIR)/fedrl/$$d; done
	ln -s ../../../proto/fedrl $(TYPECHECK_DIR)/fedrl/proto
	ln -s ../../bench $(TYPECHECK_DIR)/bench
	cd $(TYPECHECK_DIR) && ../../$(BIN)/mypy --config-file ../../pyproject.toml \
		-p fedrl.common -p fedrl.server -p fedrl.client -p fedrl.envs \
		$(foreach m,$(BENCH_MODULES),-p $(m))

# Each benchmark's short mode; run one with no flag for the full figures.
# The baselines (Stable-Baselines3) come from the bench extra. The federation
# benchmarks are modules of the bench package, run from the repository root
# with -m; the others are scripts.
bench: install
	$(PIP) --no-build-isolation -e '.[bench]'
	@for b in $(BENCH_SCRIPTS); do echo "== $$b --quick"; $(BIN)/python $$b --quick || exit 1; done
	@for m in $(BENCH_MODULES); do echo "== python -m $$m --quick"; \
		$(BIN)/python -m $$m --quick || exit 1; done

# Every wheel fedrl needs but torch, for Linux x86-64 and each CPython in
# WHEEL_PYTHONS, at the lock's versions, into $(WHEELHOUSE) (needs an index;
# see scripts/wheelhouse.py). A node without internet that brings its own torch
# then installs with `pip install --no-index --find-links wheelhouse fedrl`.
# `make wheelhouse WHEEL_PYTHONS=3.12 WHEEL_EXTRAS=atari` is the ~55 MiB that
# `make bench-gpu` needs.
WHEELHOUSE ?= wheelhouse
WHEEL_PYTHONS ?= 3.11 3.12
WHEEL_EXTRAS ?= atari,plot,video,export,trading
wheelhouse: install
	$(BIN)/python scripts/wheelhouse.py --out $(WHEELHOUSE) --extras $(WHEEL_EXTRAS) \
		$(foreach v,$(WHEEL_PYTHONS),--python $(v))

# The GPU check (docs/gpu.md) on a GPU node with no internet: fedrl from this
# tree and the lock's versions of its dependencies from WHEELHOUSE, in a venv
# over the node's own Python and torch (GPU_PYTHON), then bench/gpu.py: one
# JSON file, BENCH_GPU_OUT, in under 8 minutes on one H100. The steps are
# scripts/bench_gpu.sh, which also runs where make is not installed.
GPU_PYTHON ?= python3
GPU_VENV ?= .venv-gpu
BENCH_GPU_OUT ?= bench-gpu.json
BENCH_GPU_ARGS ?=
bench-gpu:
	GPU_PYTHON=$(GPU_PYTHON) GPU_VENV=$(GPU_VENV) WHEELHOUSE=$(WHEELHOUSE) \
		BENCH_GPU_OUT=$(BENCH_GPU_OUT) bash scripts/bench_gpu.sh $(BENCH_GPU_ARGS)

# The main job: a server on localhost and two participants training
# CartPole-v1 together until a modest goal; ends with the status table.
demo: install
	$(BIN)/python scripts/demo.py

clean:
	rm -rf $(VENV) $(GPU_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
