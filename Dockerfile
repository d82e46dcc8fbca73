# leader-sidecar: leader election next to your app (see docs/helm.md).
#
#   docker build -t leader-sidecar .
#   docker run --rm --read-only leader-sidecar --help
#
# Two stages on the same Python base: the first builds a virtualenv from wheels only (nothing is
# compiled, so neither stage needs a compiler), the second copies that virtualenv into a clean
# base and runs it as a non-root numeric user. PYTHON_IMAGE may be pinned by digest, e.g.
# --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:…; any Debian-like image with
# python3 (3.11+), the venv module and useradd works.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar/ sidecar/
# --only-binary for the dependencies: a dependency without a wheel for this platform fails the
# build here instead of pulling a compiler into the image. pip compiles every module to
# bytecode while installing, so the read-only root filesystem never needs a __pycache__. The
# image carries every store: the [postgresql] extra (asyncpg) too.
# pip and setuptools leave the virtualenv at the end: the runtime never installs anything.
RUN python3 -m venv /opt/leader-sidecar \
 && /opt/leader-sidecar/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && /opt/leader-sidecar/bin/pip install --only-binary=:all: "$(echo /tmp/wheels/*.whl)[postgresql]" \
 && /opt/leader-sidecar/bin/python -m pip uninstall --yes pip setuptools \
 && /opt/leader-sidecar/bin/leader-sidecar --version

FROM ${PYTHON_IMAGE}
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
# it is a VOLUME so that `docker run --read-only` still has somewhere to write.
RUN groupadd --gid 65532 leader-sidecar \
 && useradd --uid 65532 --gid 65532 --no-create-home --no-log-init \
      --home-dir /var/lib/leader-sidecar --shell /usr/sbin/nologin leader-sidecar \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/leader-sidecar

COPY --from=build /opt/leader-sidecar /opt/leader-sidecar

ENV PATH=/opt/leader-sidecar/bin:${PATH} \
    HOME=/var/lib/leader-sidecar \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/leader-sidecar
VOLUME ["/var/lib/leader-sidecar"]
USER 65532:65532
# Only the public listener (metrics, probes, read-only /leader). The app API listens on
# 127.0.0.1:4040 inside the pod's network namespace and is not meant to be published.
EXPOSE 4041
ENTRYPOINT ["leader-sidecar"]
