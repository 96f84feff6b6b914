# hotline-asr developer entry points. `make setup` is idempotent: a second run only checks.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PACKAGES := redis-server redis-sentinel sip-tester espeak-ng sox kamailio chromium chromium-driver prometheus fonts-wqy-microhei libjemalloc2 haproxy postgresql
# What build.sh of ../shared/peers/asterisk needs to build the Asterisk the interop tests run
# (tests/asterisk_peer.py builds it once into a cache outside the clone).
ASTERISK_BUILD_PACKAGES := build-essential pkg-config bzip2 patch libjansson-dev libedit-dev libxml2-dev libsqlite3-dev uuid-dev libssl-dev
APT_BINARIES := redis-server redis-sentinel redis-cli sipp espeak-ng sox kamailio chromium chromedriver promtool haproxy
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: setup apt-deps test lint demo demo-console demo-model bench clean

setup: apt-deps $(STAMP)

apt-deps:
	@missing=0; for b in $(APT_BINARIES); do command -v $$b >/dev/null || missing=1; done; \
	[ -f /usr/share/fonts/truetype/wqy/wqy-microhei.ttc ] || missing=1; \
	/sbin/ldconfig -p | grep -q 'libjemalloc.so.2 ' || missing=1; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing=1; \
	dpkg -s $(ASTERISK_BUILD_PACKAGES) >/dev/null 2>&1 || missing=1; \
	if [ $$missing = 1 ]; then \
	  echo "installing Debian packages: $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES) $(ASTERISK_BUILD_PACKAGES) >/dev/null; \
	fi

# torch is pinned and installed first: the CPU build is what this project targets by default,
# and an unpinned torch would pull a multi-GB CUDA build.
# (pip's notes about unusable local index folders are filtered out; errors still fail the step)
PIP := set -o pipefail; $(PY) -m pip install -q --disable-pip-version-check
QUIET := 2>&1 | { grep -v '^WARNING: Location' || true; }

$(STAMP): setup.cfg setup.py pyproject.toml rtp/_fastrtp.c asr_core/_fastctc.c
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) torch==2.13.0 $(QUIET)
	$(PIP) -e '.[test,dev,onnx,console]' $(QUIET)
	touch $(STAMP)

# As CI runs it. ASR_REQUIRE_C_EXTENSIONS: the C extensions must build (the install that `setup`
# runs for this target sees it too), so a compile error fails instead of falling back to Python.
# ASR_STRICT_SKIPS: a skip whose reason is not on the allowlist in tests/strict_skips.py (no GPU,
# no TensorRT, no bf16/VNNI CPU) fails the run; `make test ASR_STRICT_SKIPS=0` runs without that
# rule (e.g. without the WeNet fixture beside the checkout).
test: export ASR_REQUIRE_C_EXTENSIONS := 1
test: export ASR_STRICT_SKIPS := 1
test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy asr_common asr_gateway calls kv_ring sip audiosocket wsaudio rtp kb_hooks asr_core rescoring recipes deploy console archive
	$(VENV)/bin/lint-imports

# The demo-model recipe end to end (about 3 h on 2 CPU cores with these budgets; the bundled
# model had longer ones, see asr_core/demo_model/README.md). Data and checkpoints go to exp/demo.
DEMO_MODEL_MINUTES ?= 60
DEMO_FINETUNE_MINUTES ?= 60
DEMO_SERVING_MINUTES ?= 60
demo-model: setup
	$(VENV)/bin/python -m recipes.recipe --out asr_core/demo_model --work exp/demo \
	  --minutes-budget $(DEMO_MODEL_MINUTES) --finetune-minutes $(DEMO_FINETUNE_MINUTES) \
	  --serving-minutes $(DEMO_SERVING_MINUTES)

demo: setup
	$(VENV)/bin/asr-gateway demo

# The product as its users see it: the service, the console (URL and three users' passwords
# printed once) and the demo calls placed again and again for the demo agent, until Ctrl-C.
demo-console: setup
	$(VENV)/bin/asr-gateway demo --console

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache
