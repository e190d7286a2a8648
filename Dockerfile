# The one kubeserve image: the operator (`kubeserve operator`), proxies (`kubeserve proxy`), replicas
# (`kubeserve replica`) and build Jobs (`kubeserve build`) all run it with a different command.
#   docker build -t kubeserve:0.1.0 .
# The examples ship in /app/examples, so `importPath: examples.hello:app` works out of the box;
# applications of your own: build FROM this image and copy them into /app, or use runtimeEnv.

# The base: any Debian-like image with python3.11 and pip that may install into the system Python.
# The Kubernetes test node builds FROM a local debootstrap image (tests/kubernetes/node/build_images.sh).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/home/kubeserve
COPY --from=build /wheels /wheels
RUN set -eux; \
    wheel="$(ls /wheels/kubeserve-*.whl)"; \
    pip install "${wheel}[kubernetes,tracing]"; \
    rm -rf /wheels; \
    groupadd --gid 10001 kubeserve; \
    useradd --uid 10001 --gid 10001 --home-dir /home/kubeserve --create-home --shell /usr/sbin/nologin kubeserve
WORKDIR /app
COPY --chown=10001:10001 examples ./examples
# Numeric, so runAsNonRoot can verify it without resolving names.
USER 10001:10001
EXPOSE 8000 8265
ENTRYPOINT ["kubeserve"]
CMD ["--help"]
