# CPU image of the pipeline (a first version; GPU/CUDA variants come with the lifecycle issue).
# Build: docker build -t bertflow .      Run: docker run --rm -v "$PWD:/work" -w /work bertflow run
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DVC_NO_ANALYTICS=1 \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

# git: DVC needs a repository; the data stages need nothing else from the system.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 bertflow

WORKDIR /opt/bertflow
# torch first, from the CPU wheel index (the default index would pull a multi-GB CUDA build).
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md ./
COPY components components
COPY pipeline pipeline
RUN pip install .

USER 10001
WORKDIR /work
# Run the code of the checkout mounted at /work (the code dvc.lock hashes), not the copy above.
ENV PYTHONPATH=/work
ENTRYPOINT ["bertflow"]
CMD ["--help"]
