# slo-api: a slim, non-root image running the `slo-api` console script as PID 1.
#
#   docker build -t slo-api:0.1.0 .
#
# Two stages: the first builds a virtual environment (dependencies in their own layer, so
# editing the code does not reinstall them), the second copies only that environment.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Dependencies only, read from pyproject.toml: this layer changes only when pyproject.toml does.
COPY pyproject.toml ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > requirements.txt \
    && pip install -r requirements.txt

# The package itself, without touching the dependencies (hatchling needs the README too).
COPY README.md ./
COPY slo_api/ slo_api/
RUN pip install --no-deps . \
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

RUN groupadd --system --gid 10001 slo-api \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin slo-api

COPY --from=build /opt/venv /opt/venv

# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080
# Exec form: slo-api is PID 1 and receives SIGTERM itself (readiness 503, drain, close watches).
ENTRYPOINT ["slo-api"]
