# leader-sidecar: leader election next to your app (see docs/helm.md).
#
#   docker build -t leader-sidecar .
#   docker run --rm --read-only leader-sidecar --help
#
# The build stage makes a virtualenv from wheels only (nothing is compiled, so no compiler is
# needed), then stages a whole root filesystem with scripts/image_rootfs.py: the virtualenv, the
# interpreter and the standard library it runs on (without tests, IDLE, tkinter, pip and the
# like), the shared libraries they load (found with ldd), the CA bundle, and /etc entries for
# the numeric non-root user. The final stage is that directory alone, FROM scratch: no shell,
# no package manager. PYTHON_IMAGE may be pinned by digest, e.g.
# --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:…; any Debian-like image with
# python3 (3.11+), the venv module, ldd and CA certificates works.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# PIP_CERT: a CA bundle for pip behind a TLS-inspecting proxy, mounted for the build only.
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar/ sidecar/
COPY scripts/image_rootfs.py ./
# --only-binary for the dependencies: a dependency without a wheel for this platform fails the
# build here instead of pulling a compiler into the image. pip compiles every module to
# bytecode while installing, so the read-only root filesystem never needs a __pycache__. The
# image carries every store: the [postgresql] extra (asyncpg) too.
# pip and setuptools leave the virtualenv at the end: the runtime never installs anything.
# The staged root is tried before it becomes the image: the CLI and every store's driver.
RUN python3 -m venv /opt/leader-sidecar \
 && /opt/leader-sidecar/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && /opt/leader-sidecar/bin/pip install --only-binary=:all: "$(echo /tmp/wheels/*.whl)[postgresql]" \
 && /opt/leader-sidecar/bin/python -m pip uninstall --yes pip setuptools \
 && /opt/leader-sidecar/bin/python image_rootfs.py /opt/leader-sidecar /rootfs \
 && chroot /rootfs /opt/leader-sidecar/bin/leader-sidecar --version \
 && chroot /rootfs /opt/leader-sidecar/bin/python3 -c "import asyncpg, redis.asyncio, sqlite3, ssl, yaml"

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="leader-sidecar" \
      org.opencontainers.image.description="Leader election next to your app: one lease, one leader, a fencing term on localhost" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# A numeric user (Kubernetes' runAsNonRoot can only verify a numeric USER) with a passwd entry
# so that tools asking "who am I" get an answer. /var/lib/leader-sidecar is the working
# directory: the embedded store's default path (sqlite:///./leader-sidecar.db) lands there, and
# it is a VOLUME so that `docker run --read-only` still has somewhere to write. The second COPY
# makes its owner explicit for builders that do not keep a stage's ownership.
COPY --from=build /rootfs /
COPY --from=build --chown=65532:65532 /rootfs/var/lib/leader-sidecar /var/lib/leader-sidecar

ENV PATH=/opt/leader-sidecar/bin:/usr/local/bin:/usr/bin:/bin \
    HOME=/var/lib/leader-sidecar \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/leader-sidecar
VOLUME ["/var/lib/leader-sidecar"]
USER 65532:65532
# Only the public listener (metrics, probes, read-only /leader). The app API listens on
# 127.0.0.1:4040 inside the pod's network namespace and is not meant to be published.
EXPOSE 4041
ENTRYPOINT ["leader-sidecar"]
