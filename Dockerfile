# slo-api: a slim, non-root image running the `slo-api` console script as PID 1.
#
#   make image                      # podman, with the host's CA bundle when it has one
#   docker build -t slo-api:0.1.0 . # the same Dockerfile, with Docker
#
# Two stages: the first installs the exact versions and hashes of requirements.lock into
# /opt/venv (dependencies in their own layer, so editing the code does not reinstall them) and
# builds the package with the backend pinned in requirements-build.lock, in a virtual environment
# of its own; the second copies only /opt/venv: no pip, no build backend, no compiler.
#
# PYTHON_IMAGE may be any Debian-like image with python3 (and its venv module) on the PATH and
# useradd; the lock was resolved for CPython 3.11 on Linux, so keep that version. What a base
# made from Debian's packages needs for these stages (the image test builds one with mmdebstrap):
# Debian packages: python3 python3-venv
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1
WORKDIR /src

# Dependencies only: this layer changes only when a lock does. --require-hashes also fails
# the build when the lock misses a dependency. A CA bundle given as the build secret
# `ca-bundle` (a TLS-inspecting proxy's, say) is trusted for these downloads and stays out of
# the image.
COPY requirements.lock requirements-build.lock ./
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python3 -m venv /opt/build \
    && /opt/build/bin/pip install --require-hashes --only-binary=:all: -r requirements-build.lock \
    && python3 -m venv --without-pip /opt/venv \
    && /opt/build/bin/pip --python /opt/venv/bin/python install --require-hashes \
        --only-binary=:all: -r requirements.lock

# The package itself, built without fetching anything (hatchling reads README.md too).
COPY pyproject.toml README.md ./
COPY slo_api/ slo_api/
RUN /opt/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /tmp/dist . \
    && /opt/build/bin/pip --python /opt/venv/bin/python install --no-deps --no-index /tmp/dist/*.whl \
    && /opt/build/bin/pip --python /opt/venv/bin/python check \
    && test -x /opt/venv/bin/slo-api


FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="slo-api" \
      org.opencontainers.image.description="REST front door onto the Kubernetes custom resources that hold inference SLOs" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    PORT=8080

RUN groupadd --gid 10001 slo-api \
    && useradd --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin slo-api

COPY --from=build /opt/venv /opt/venv

# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080
# Exec form: slo-api is PID 1 and receives SIGTERM itself (readiness 503, drain, close watches).
ENTRYPOINT ["slo-api"]
