# nmt-serve: the translation service with the shipped multilingual model (12 directions between en, de, fr, cs) baked in.
#
#   CPU:  docker build -t nmt-serve .
#         docker run -p 8000:8000 nmt-serve
#   GPU:  docker build --build-arg TORCH_INDEX_URL= -t nmt-serve:gpu .      (PyPI's torch: CUDA 13, driver >= 580)
#         docker run --gpus all -p 8000:8000 nmt-serve:gpu        (device=auto picks the GPU)
#
# Build arguments:
#   BASE_IMAGE       a Debian/Ubuntu image with python3 (3.10+) and venv; default python:3.11-slim
#   TORCH_VERSION    torch release to install (default 2.13.0)
#   TORCH_INDEX_URL  where torch comes from: the CPU-only index by default (a much smaller image);
#                    empty for PyPI's torch, which on Linux x86_64 is the CUDA 13 build (GPU hosts);
#                    or an index of download.pytorch.org/whl/ that has this torch version for your CUDA
#   VERSION, REVISION, SOURCE   the OCI labels' version, revision (git commit) and source (repository URL)
#   Local wheels put in docker/wheels/ are preferred (offline builds). A CA bundle put at
#   docker/certs/extra-ca.crt is trusted by pip during the build (networks with a TLS proxy); it does
#   not reach the runtime image.
#
# Build with `--format docker` under buildah/podman: the OCI format has no HEALTHCHECK.
# The models live in /models (baked in); to serve others, mount a directory of checkpoints there
# (`-v /srv/models:/models:ro`) or point NMT_MODELS_DIR elsewhere. No VOLUME is declared: it would
# make an anonymous volume on every run and hide the baked-in models behind it on some runtimes.

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
COPY nmt_serve/ /src/nmt_serve/
RUN pip install --no-deps --no-build-isolation /src || pip install --no-deps /src
# what serving never reads leaves before the copy into the runtime stage: torch's C++ test binaries
# and headers (for building extensions), the build tools, and headers of other wheels (triton's are
# kept: it compiles kernels at run time). torch/testing/_internal stays: torch._refs and
# torch.utils.checkpoint import it.
RUN sp=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
    && rm -rf "$sp/torch/test" "$sp/torch/include" "$sp/torch/share/cmake" \
    && find "$sp/torch/bin" -mindepth 1 ! -name torch_shm_manager -exec rm -rf {} + \
    && find "$sp" -type d -name include -not -path "*/triton/*" -prune -exec rm -rf {} + \
    && python3 -m pip uninstall -y -q pip setuptools wheel 2>/dev/null; \
    rm -f "$sp/distutils-precedence.pth" && rm -rf "$sp/_distutils_hack" /opt/venv/bin/pip* \
    && python3 -c "import torch, nmt_serve.inference.translator, nmt_serve.engine.core, nmt_serve.service.app; assert (torch.ones(2) @ torch.ones(2)).item() == 2" \
    && NUMBA_CACHE_DIR=/tmp/numba python3 -c "from nmt_serve.inference import row_products; assert row_products.available()" \
    && ! python3 -c "import pip" 2>/dev/null

# ---------------------------------------------------------------------------- runtime stage
FROM ${BASE_IMAGE}
# the base's own pip (python images have one) goes too: nothing is installed at run time
RUN (getent group app || groupadd --system --gid 10001 app) \
    && (getent passwd app || useradd --system --uid 10001 --gid app --home-dir /app --no-create-home app) \
    && mkdir -p /app && chown app:app /app \
    && if python3 -m pip --version >/dev/null 2>&1; then python3 -m pip uninstall -y -q pip setuptools wheel; fi
COPY --from=build /opt/venv /opt/venv
# numba's OpenMP pool (a lone search's products split over its threads: row_products.py) loads GNU libgomp by the name
# libgomp.so.1.0.0, which slim bases lack; torch bundles one. That name for torch's copy makes one OpenMP runtime
# serve both. A base with its own libgomp keeps it.
RUN gomp=$(find /opt/venv -path "*/torch/lib/libgomp.so.1" | head -n 1) \
    && if [ -n "$gomp" ] && ! ls /usr/lib/libgomp.so.1.0.0 /usr/lib/*/libgomp.so.1.0.0 >/dev/null 2>&1; then \
           ln -s "$gomp" /usr/lib/libgomp.so.1.0.0; fi
COPY --chown=app:app checkpoints/ /models/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NMT_HOST=0.0.0.0 \
    NMT_PORT=8000 \
    NMT_MODELS_DIR=/models \
    NMT_DEVICE=auto
# serve other models by mounting a directory of checkpoints over /models (or setting NMT_MODELS_DIR)
WORKDIR /app
USER app
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('NMT_PORT', '8000')}/health/ready\", timeout=2)"]
# exec form: python is PID 1 and gets SIGTERM itself; in-flight requests finish before it exits
STOPSIGNAL SIGTERM
CMD ["python3", "-m", "nmt_serve.service"]
# last, so that a new commit changes only this metadata, not a cached layer
ARG VERSION=0.1.0
ARG REVISION=
ARG SOURCE=
LABEL org.opencontainers.image.title="nmt-serve" \
      org.opencontainers.image.description="Translation service (de<->en Transformer, continuous batching; REST and LibreTranslate-compatible API)" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
