# syntax=docker/dockerfile:1.7
# edgespec verifier on a CUDA base: the target runs on the GPU.
# Build from the repository root:
#   docker build -f deploy/docker/server-cuda.Dockerfile -t edgespec-server:cuda .
# Run with the NVIDIA container toolkit: docker run --gpus all ...
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

# torch pinned to the project's version, built for the base image's CUDA.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/edgespec \
    PATH=/opt/edgespec/bin:$PATH \
    EDGESPEC_HOME=/var/lib/edgespec \
    EDGESPEC_HOST=0.0.0.0 \
    EDGESPEC_GRPC_PORT=50051 \
    EDGESPEC_HTTP_PORT=8080 \
    EDGESPEC_LOG_FORMAT=json \
    EDGESPEC_HEALTH_ROLE=server

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# The venv belongs to the runtime user: `edgespec models prepare` installs the
# model part packages into it at first start.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/edgespec edgespec \
 && python3 -m venv /opt/edgespec \
 && mkdir -p /var/lib/edgespec \
 && chown -R edgespec:edgespec /opt/edgespec /var/lib/edgespec

USER edgespec
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
COPY --chown=edgespec:edgespec . /home/edgespec/src
RUN pip install /home/edgespec/src
COPY --chown=edgespec:edgespec deploy/bin/edgespec-entrypoint /opt/edgespec/bin/edgespec-entrypoint

# The model cache: prepared models survive the container (or mount a cache).
VOLUME ["/var/lib/edgespec"]
EXPOSE 50051 8080
# /health is 503 while the model loads (start period) and while draining.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
  CMD ["edgespec-entrypoint", "healthcheck"]
# SIGTERM drains: in-flight verifications finish, then edgespec exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["edgespec-entrypoint"]
CMD ["server"]
