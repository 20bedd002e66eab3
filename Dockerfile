# slo-api: a slim, non-root image running the `slo-api` console script as PID 1.
#
#   make image      # podman, with the host's CA bundle when it has one, labelled as below
#   docker build --build-arg VERSION=$(python3 -m release.version) \
#     -t slo-api:$(python3 -m release.version) .   # the same Dockerfile, with Docker
#
# Two stages: the first installs the exact versions and hashes of requirements.lock into
# /opt/venv (dependencies in their own layer, so editing the code does not reinstall them) and
# builds the package with the backend pinned in requirements-build.lock, in a virtual environment
# of its own; the second copies only /opt/venv: no pip, no build backend, no compiler.
#
# PYTHON_IMAGE may be any Debian-like image with python3 (and its venv module) on the PATH and
# useradd; the lock was resolved for CPython 3.11 on Linux, so keep that version. The default is
# pinned by digest (the tag only says what it was), so two builds of one commit start from the
# same base; move the pin on purpose, e.g. to `crane digest python:3.11-slim-bookworm`.
# What a base made from Debian's packages needs for these stages (the image test builds one with
# mmdebstrap, where no registry is reachable):
# Debian packages: python3 python3-venv
ARG PYTHON_IMAGE=python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

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

# The package itself, built without fetching anything (hatchling reads README.md too, and puts
# LICENSE in the package's metadata).
COPY pyproject.toml README.md LICENSE ./
COPY slo_api/ slo_api/
RUN /opt/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /tmp/dist . \
    && /opt/build/bin/pip --python /opt/venv/bin/python install --no-deps --no-index /tmp/dist/*.whl \
    && /opt/build/bin/pip --python /opt/venv/bin/python check \
    && test -x /opt/venv/bin/slo-api


FROM ${PYTHON_IMAGE}
# What the image is and where it came from, given by the build (`make image` passes them: see
# release/image.py): the version (pyproject.toml's), the repository's URL, the commit, and the
# commit's time (so a rebuild labels the same).
ARG VERSION=""
ARG SOURCE=""
ARG REVISION=""
ARG CREATED=""
LABEL org.opencontainers.image.title="slo-api" \
      org.opencontainers.image.description="REST front door onto the Kubernetes custom resources that hold inference SLOs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    PORT=8080

# No pip, setuptools or wheel, whatever the base ships: python:*-slim installs all three (and
# ensurepip's bundled wheels), Debian's venv module brings pip's and setuptools' wheels. slo-api
# runs from /opt/venv and installs nothing at run time; an installer left in the image is only
# a tool for whoever gets in. Searched where Python keeps them (any python3.X), /opt/venv aside.
RUN for dir in /usr/local/lib/python3* /usr/lib/python3* /usr/share/python-wheels \
        /usr/local/bin /usr/bin; do \
      [ -d "$dir" ] || continue; \
      find "$dir" -depth \( -name 'pip' -o -name 'pip-*' -o -name 'pip3' -o -name 'pip3.*' \
        -o -name 'setuptools' -o -name 'setuptools-*' -o -name 'pkg_resources' \
        -o -name '_distutils_hack' -o -name 'distutils-precedence.pth' \
        -o -name 'wheel' -o -name 'wheel-*' -o -name 'easy_install*' -o -name 'ensurepip' \) \
        -exec rm -rf {} +; \
    done \
    && groupadd --gid 10001 slo-api \
    && useradd --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin slo-api

COPY --from=build /opt/venv /opt/venv

# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080
# Exec form: slo-api is PID 1 and receives SIGTERM itself (readiness 503, drain, close watches).
ENTRYPOINT ["slo-api"]
