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
EXTRAS := dev,plot,export,atari,video,box2d,bench
INSTALL_EXTRAS := dev,plot,export,atari,video

# The benchmarks run with -m (and type-checked); every other bench/*.py is a script.
BENCH_MODULES := bench.federation bench.federation_sim bench.population
BENCH_SCRIPTS := $(filter-out bench/__init__.py bench/federation_sim.py,$(wildcard bench/*.py))

.PHONY: install lock browser test test-all proto proto-check lint fmt typecheck bench demo clean

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

# The dashboard's browser test drives Debian's headless Chromium through its
# chromedriver (tests/test_dashboard_browser.py); a CJK font lets its
# screenshot show ids such as 李雷. Installed where this runs as root with
# apt-get; elsewhere the test skips and says why.
BROWSER_PACKAGES := chromium chromium-driver fonts-wqy-microhei
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES)
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing $(BROWSER_PACKAGES) for the dashboard's browser test"; \
		$(APT_INSTALL) >/dev/null || { apt-get update -qq && $(APT_INSTALL) >/dev/null; } \
		|| echo "note: apt-get could not install them: the dashboard's browser test will skip"; \
	else \
		echo "note: no chromium and chromedriver, and installing them needs root and apt-get:"; \
		echo "      the dashboard's browser test will skip"; \
	fi

test: install browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-all: install browser
	$(BIN)/python -m pytest -m '' $(PYTEST_ARGS)

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

# The main job: a server on localhost and two participants training
# CartPole-v1 together until a modest goal; ends with the status table.
demo: install
	$(BIN)/python scripts/demo.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
