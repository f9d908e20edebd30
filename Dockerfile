# nmt-serve: the translation service with the shipped de<->en models baked in.
#
#   CPU:  docker build -t nmt-serve .
#         docker run -p 8000:8000 nmt-serve
#   GPU:  docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 -t nmt-serve:gpu .
#         docker run --gpus all -p 8000:8000 nmt-serve:gpu        (device=auto picks the GPU)
#
# Build arguments:
#   BASE_IMAGE       a Debian/Ubuntu image with python3 (3.10+) and venv; default python:3.11-slim
#   TORCH_VERSION    torch release to install (default 2.13.0)
#   TORCH_INDEX_URL  where torch comes from: the CPU-only index by default (a much smaller image);
#                    a CUDA index (e.g. .../whl/cu124) for GPU hosts; empty to use PyPI/local wheels only
#   Local wheels put in docker/wheels/ are preferred (offline builds). A CA bundle put at
#   docker/certs/extra-ca.crt is trusted by pip during the build (networks with a TLS proxy); it does
#   not reach the runtime image.

ARG BASE_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------- build stage
FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/certs/ /certs/
COPY docker/wheels/ /wheels/
# torch first and alone: the largest layer, rebuilt only when its version or source changes
RUN if [ -s /certs/extra-ca.crt ]; then export PIP_CERT=/certs/extra-ca.crt; fi \
    && pip install --find-links /wheels ${TORCH_INDEX_URL:+--extra-index-url ${TORCH_INDEX_URL}} "torch==${TORCH_VERSION}"
# then the other dependencies, from pyproject.toml alone (code changes do not invalidate this layer)
COPY pyproject.toml README.md /src/
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml','rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && if [ -s /certs/extra-ca.crt ]; then export PIP_CERT=/certs/extra-ca.crt; fi \
    && pip install --find-links /wheels -r /tmp/requirements.txt
COPY model/ /src/model/
COPY service/ /src/service/
COPY engine/ /src/engine/
RUN pip install --no-deps --no-build-isolation /src || pip install --no-deps /src

# ---------------------------------------------------------------------------- runtime stage
FROM ${BASE_IMAGE}
RUN (getent group app || groupadd --system --gid 10001 app) \
    && (getent passwd app || useradd --system --uid 10001 --gid app --home-dir /app --no-create-home app) \
    && mkdir -p /app && chown app:app /app
COPY --from=build /opt/venv /opt/venv
COPY --chown=app:app checkpoints/ /models/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NMT_HOST=0.0.0.0 \
    NMT_PORT=8000 \
    NMT_MODELS_DIR=/models \
    NMT_DEVICE=auto
# serve other models by mounting a directory of checkpoints over /models (or setting NMT_MODELS_DIR)
VOLUME ["/models"]
WORKDIR /app
USER app
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('NMT_PORT', '8000')}/health/ready\", timeout=2)"]
# exec form: python is PID 1 and gets SIGTERM itself; in-flight requests finish before it exits
STOPSIGNAL SIGTERM
CMD ["python3", "-m", "service"]
