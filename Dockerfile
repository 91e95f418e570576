# The pipeline in a container: `bertflow` as entry point, run on a mounted checkout.
#
# CPU (default):  docker build -t bertflow .
# CUDA:           docker build -t bertflow:cuda \
#                   --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
# Run:            docker run --rm --user "$(id -u):$(id -g)" -v "$PWD:$PWD" -w "$PWD" \
#                   -e PYTHONPATH="$PWD" bertflow run              (add --gpus all with :cuda)
# Serve a model:  docker run --rm -p 127.0.0.1:5000:5000 --user "$(id -u):$(id -g)" \
#                   -v "$PWD:$PWD" -w "$PWD" -e PYTHONPATH="$PWD" bertflow \
#                   serve-model movie-sentiment --host 0.0.0.0 --port 5000
# The checkout at its own path: mlflow.db keeps absolute artifact locations, which then hold
# inside and outside the container (at /work it is a project of another path).
# --user: the mounted checkout is the host user's; run as that uid, the container can write it
# and what it writes stays the host user's. Without it the image runs as uid 10001, and
# `bertflow run` refuses a checkout it cannot write, naming both uids.
# Nothing secret is baked in: pass credentials (S3 remote, MLflow server) with -e at run time.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DEBIAN_FRONTEND=noninteractive \
    DVC_NO_ANALYTICS=1 \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# git: DVC needs a repository. Python comes with the slim image; a CUDA base image gets Ubuntu's.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates \
    && if ! command -v python3 >/dev/null; then \
         apt-get install -y --no-install-recommends python3 python3-venv; fi \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --create-home --uid 10001 bertflow \
    && chmod 1777 /home/bertflow \
    && git config --system --add safe.directory '*'
# The mounted checkout belongs to the host user, maybe not to the uid git runs as: git refuses
# such a repository ("dubious ownership"), and the runs would record git.commit none, unless it
# is marked safe (any path, for any uid: whatever is mounted here is the user's own). Under --user
# the uid has no passwd entry and no home: HOME (writable by any uid) and USER are set for the
# tools that look them up (git, DVC, MLflow).
ENV HOME=/home/bertflow \
    USER=bertflow \
    LOGNAME=bertflow

WORKDIR /opt/bertflow
# torch first, pinned as in pyproject.toml, from the CPU (or CUDA) wheel index: the default
# index would pull a multi-GB CUDA build into the CPU image.
RUN pip install --index-url "${TORCH_INDEX}" torch==2.13.0
COPY pyproject.toml README.md ./
COPY components components
COPY pipeline pipeline
# The same install as the README's `make` targets, without the dev extras.
RUN pip install .

USER 10001
WORKDIR /work
# Run the code of the mounted checkout (the code dvc.lock hashes), not the copy above; at its
# own path, pass -e PYTHONPATH="$PWD".
ENV PYTHONPATH=/work
ENTRYPOINT ["bertflow"]
CMD ["--help"]
