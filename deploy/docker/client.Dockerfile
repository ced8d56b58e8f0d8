# syntax=docker/dockerfile:1.7
# edgespec client: drafter + local OpenAI-compatible API (CPU, like a laptop).
# The same image runs the userspace network relay (`relay` role) and carries
# iproute2 for tc/netem shaping when given NET_ADMIN.
# Build from the repository root:
#   docker build -f deploy/docker/client.Dockerfile -t edgespec-client .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# torch first, pinned, from the CPU index: a bare `torch` requirement (pulled in
# by edgespec's dependencies) would otherwise bring gigabytes of CUDA wheels.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/edgespec \
    PATH=/opt/edgespec/bin:$PATH \
    EDGESPEC_HOME=/var/lib/edgespec \
    EDGESPEC_HOST=0.0.0.0 \
    EDGESPEC_CLIENT_PORT=8000 \
    EDGESPEC_HEALTH_ROLE=client \
    OMP_NUM_THREADS=2

RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 \
 && rm -rf /var/lib/apt/lists/*

# The venv belongs to the runtime user: `edgespec models prepare` installs the
# model part packages into it at first start.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/edgespec edgespec \
 && python -m venv /opt/edgespec \
 && mkdir -p /var/lib/edgespec \
 && chown -R edgespec:edgespec /opt/edgespec /var/lib/edgespec

USER edgespec
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
COPY --chown=edgespec:edgespec . /home/edgespec/src
RUN pip install /home/edgespec/src
COPY --chown=edgespec:edgespec deploy/bin/edgespec-entrypoint /opt/edgespec/bin/edgespec-entrypoint

# The drafter and the target's embedding/LM head are cached here.
VOLUME ["/var/lib/edgespec"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD ["edgespec-entrypoint", "healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["edgespec-entrypoint"]
CMD ["client"]
