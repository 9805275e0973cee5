# soak-sidecar image: the sidecar CLI in a venv, the stdlib-only launcher (installed into the pod
# by `soak-sidecar install-launcher`) and the mock NVML library for clusters without GPUs.
#
# The base is pinned by tag and digest (the digest of python:3.12-slim-bookworm as used in public
# Dockerfiles; refresh both together, e.g. `docker buildx imagetools inspect python:3.12-slim-bookworm`).
# Build and runtime share the interpreter, so the venv's interpreter path and glibc match.
# Offline builds (the real-node e2e, tests/cluster/images.py): BUILD_IMAGE may be a base that already
# has gcc, and wheels in docker/wheels/ are installed with --no-index, so no step needs a network.
# Either way the dependencies are requirements.lock's, hash-checked (pip --require-hashes).
# No `# syntax=` line: BuildKit would fetch its frontend image for it.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm@sha256:782412e85d0f0984994c290652577d4018aff08145c85b262bb63dc0c7522254
ARG BUILD_IMAGE=${PYTHON_IMAGE}

FROM ${BUILD_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# gcc only lives in this throwaway stage; the version comes with the pinned Debian release.
# hadolint ignore=DL3008
RUN if ! command -v gcc >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends gcc libc6-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY sidecar ./sidecar
COPY soak_sidecar_kit ./soak_sidecar_kit
COPY docker/wheels ./wheels
# Dependencies only as locked, each file checked against its hash; then the project without deps.
# Then out of the image what the sidecar never runs: the Kubernetes client's asyncio half
# (kubernetes.aio, 38 MiB with its bytecode) and aiohttp with its dependencies, which only that
# half imports, and the installers (pip, setuptools). The mock NVML stays in its own small layer.
RUN python3 -m venv /opt/venv \
    && if ls wheels/*.whl >/dev/null 2>&1; then \
        /opt/venv/bin/pip install --no-cache-dir --no-index --find-links wheels \
            --require-hashes -r requirements.lock \
        && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links wheels --no-deps soak-sidecar; \
    else \
        /opt/venv/bin/pip install --no-cache-dir --require-hashes -r requirements.lock \
        && /opt/venv/bin/pip install --no-cache-dir --no-deps .; \
    fi \
    && /opt/venv/bin/python -m sidecar.nvml_mock.build /opt/soak/nvml-mock \
    && /opt/venv/bin/python -m pip uninstall -y -q \
        aiohttp aiohappyeyeballs aiosignal frozenlist multidict propcache yarl \
    && rm -rf /opt/venv/lib/python3*/site-packages/kubernetes/aio \
    && /opt/venv/bin/python -m pip uninstall -y -q pip setuptools \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE}
ARG SOAK_UID=10001
# The chart runs every container as this UID (podSecurity.runAsUser); the image matches it.
RUN groupadd --system --gid "${SOAK_UID}" soak \
    && useradd --system --uid "${SOAK_UID}" --gid soak --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin soak
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/soak/nvml-mock /opt/soak/nvml-mock
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SOAK_GPU__MOCK_LIBRARY_DIR=/opt/soak/nvml-mock
WORKDIR /tmp
USER ${SOAK_UID}:${SOAK_UID}
ENTRYPOINT ["soak-sidecar"]
CMD ["--help"]
