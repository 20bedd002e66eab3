# slo-api: `make demo` to see it work, `make test` to check it. Both build what is missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: venv lock image release podman test-tools prometheus controlplane chromium test lint unit integration browser screenshot cluster demo openapi docs bench soak robustness robustness-pass clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

# requirements.lock and requirements-build.lock (what the image installs, exact versions with
# hashes) from pyproject.toml; rerun after changing its dependencies (a unit test says when).
lock: venv
	$(PY) -m release.lock

# kube-apiserver, etcd and Jaeger (the trace tests' backend), built from the Go module proxy
# once and cached by version.
controlplane: venv
	$(PY) -m controlplane build

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check slo_api controlplane tests bench release robustness
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# Installs Debian's packages for the commands that are missing, as root (else says what to install):
# $(call debian-packages,command:package ...).
define debian-packages
	@missing=; for needed in $(1); do \
	  PATH="$$PATH:/usr/sbin:/sbin" command -v $${needed%%:*} >/dev/null || missing="$$missing $${needed#*:}"; \
	done; \
	test -z "$$missing" || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "needs Debian's$$missing: sudo apt-get install -y$$missing" >&2; exit 1; fi; }
endef

podman:
	$(call debian-packages,podman:podman)

# The image test (podman, runc to run it, mmdebstrap for its base) and the alert tests (promtool).
test-tools:
	$(call debian-packages,podman:podman runc:runc mmdebstrap:mmdebstrap promtool:prometheus)

# The demo's and the browser tests' Prometheus (server and promtool).
prometheus:
	$(call debian-packages,prometheus:prometheus promtool:prometheus)

# The image, with podman. BASE=<image> builds on another base than the Dockerfile's
# python:3.11-slim (pinned by digest); BASE=debian makes one from Debian's packages (mmdebstrap,
# for machines that reach no image registry). SOURCE=<repository URL> labels where it came from
# (default: the git remote origin). Needs only python3 and podman.
VERSION := $(shell $(PYTHON) -m release.version)
IMAGE ?= slo-api:$(VERSION)
image: podman
	$(PYTHON) -m release.image --tag $(IMAGE) $(if $(SOURCE),--source $(SOURCE)) \
	  $(if $(filter debian,$(BASE)),--debian-base,$(if $(BASE),--base $(BASE)))

# A release in dist/<version>/: the wheel and sdist, the image as an OCI archive with its digest,
# config/ with the image pinned to that digest (a kustomize tarball, and rendered into one YAML
# file), the SBOM of requirements.lock (CycloneDX JSON) and SHA256SUMS over them. BASE as for
# `make image` (default: the Dockerfile's base, from its registry; BASE=debian where no
# registry is reachable, with mmdebstrap); REPOSITORY=<registry>/slo-api names the image in
# the bundle (default: slo-api, to be set with kustomize's `images`).
release: venv podman
	@test -z "$(filter debian,$(BASE))" || command -v mmdebstrap >/dev/null || $(MAKE) test-tools
	$(PY) -m release.dist $(if $(SOURCE),--source $(SOURCE)) \
	  $(if $(REPOSITORY),--repository $(REPOSITORY)) \
	  $(if $(filter debian,$(BASE)),--debian-base,$(if $(BASE),--base $(BASE)))

# Debian's Chromium for the browser tests (Playwright's own browser download is not used).
chromium:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "browser tests need Debian's chromium: sudo apt-get install -y chromium" >&2; exit 1; fi; }

test: venv controlplane chromium test-tools prometheus lint
	$(PY) -m pytest -ra

robustness-pass: venv controlplane
	$(PY) -m pytest -ra tests/robustness

browser: venv controlplane chromium prometheus
	$(PY) -m pytest -ra tests/browser

# Regenerates docs/demo-webui.png and docs/attainment.png from the browser tests.
screenshot: venv controlplane chromium prometheus
	SLO_API_UPDATE_SCREENSHOT=1 $(PY) -m pytest -ra tests/browser

unit: venv
	$(PY) -m pytest -ra tests/unit

integration: venv controlplane test-tools
	$(PY) -m pytest -ra tests/integration

cluster: venv controlplane
	$(PY) -m controlplane cluster --dir .cluster

clean:
	rm -rf $(VENV) .cluster .demo .pytest_cache .mypy_cache .ruff_cache

# TRACING=1: also Jaeger, with every request traced (the demo prints where to look).
demo: venv controlplane prometheus
	$(PY) -m controlplane demo --dir .demo $(if $(TRACING),--tracing)

openapi: venv
	$(PY) -m slo_api.openapi openapi.yaml

# The settings table in docs/operating.md, from the Settings fields' descriptions.
docs: venv
	$(PY) -m release.docs

# A longer bounded soak against the real control plane; prints its figures as JSON.
soak: venv controlplane
	$(PY) -m tests.soak --duration 300

# The robustness harness: seeded random traffic and faults against the real control plane and
# two slo-api replicas, recorded and validated (docs/development.md). `make robustness-pass`
# runs the short pass with two fixed seeds (tests/robustness/) alone; `make test` runs it too.
# DURATION seconds of traffic (120), SEED (random, printed); recording and report under
# .robustness/. NO="kill pause" turns faults off.
robustness: venv controlplane
	$(PY) -m robustness run --duration $(or $(DURATION),120) $(if $(SEED),--seed $(SEED)) \
	  $(foreach fault,$(NO),--no-$(fault))

# Benchmarks against side-by-side baselines; not part of `make test`. Writes BENCHMARKS.md and
# bench/results.json; installs Debian's wrk when missing and run as root. About 23 minutes.
bench: venv controlplane
	$(PY) -m bench
