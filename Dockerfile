# One image for every toolnexus process: `toolnexus worker web|http|gateway|webhook|email|
# auto|terminal`, an agent, or `toolnexus ask/status/check`. Build: docker build -t toolnexus .
# Multi-stage: the build stage makes a virtual environment; the runtime stage copies only it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bridge bridge
COPY workers workers
# The workers' extras (web page, HTTP answering API, wait gateway, webhooks, email), metrics
# (--metrics-port) and tracing; the chat bots' and frameworks' extras are left to images of
# their own.
RUN python -m venv /opt/toolnexus \
    && /opt/toolnexus/bin/pip install --no-cache-dir \
       ".[web,http,gateway,webhook,email,metrics,tracing]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="toolnexus" \
      org.opencontainers.image.description="Pause an AI agent for a person anywhere in a fleet"
RUN groupadd --system --gid 10001 toolnexus \
    && useradd --system --uid 10001 --gid toolnexus --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin toolnexus
COPY --from=build /opt/toolnexus /opt/toolnexus
ENV PATH=/opt/toolnexus/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /tmp
# Healthy while a worker in this container keeps a fresh heartbeat in Redis (its own
# credentials in TOOLNEXUS_URL suffice). Agents and one-off commands disable it.
HEALTHCHECK --interval=30s --timeout=15s --start-period=30s --retries=3 \
    CMD ["toolnexus", "check", "--here"]
ENTRYPOINT ["toolnexus"]
CMD ["--help"]
