# The one kubeserve image: the operator (`kubeserve operator`), proxies (`kubeserve proxy`), replicas
# (`kubeserve replica`) and build Jobs (`kubeserve build`) all run it with a different command.
#   docker build -t kubeserve:0.1.0 .
# The examples ship in /app/examples, so `importPath: examples.hello:app` works out of the box;
# applications of your own: build FROM this image and copy them into /app, or use runtimeEnv.

# The base: any Debian-like image with python3.11 and pip that may install into the system Python.
# The Kubernetes test node builds FROM a local debootstrap image (tests/kubernetes/node/build_images.sh).
ARG BASE_IMAGE=python:3.11-slim
# The native data path (native/, Rust): `kubeserve-fastpath`, at /usr/local/bin/kubeserve-fastpath
# (KUBESERVE_FASTPATH_BINARY names it), the proxies' default data path (a ServeInstance's
# spec.proxy.dataPath: python opts out). By default it is compiled in NATIVE_IMAGE, a Rust toolchain on the
# base's Debian release (bookworm: glibc 2.36). A build that cannot pull one (the test node's)
# gives FASTPATH_PREBUILT instead: the context path of a binary built for that glibc or older
# (`make native` on bookworm), and NATIVE_IMAGE=its base image; nothing is compiled then.
# The replica's compiled extension `kubeserve._native` (native/pyext, CPython's stable ABI >= 3.11)
# is built beside it (NATIVE_EXT_PREBUILT: the context path of one built by `make native`) and
# installed into the kubeserve package, so every replica pod seals its channel with it.
ARG NATIVE_IMAGE=rust:1-slim-bookworm

FROM ${NATIVE_IMAGE} AS native
ARG FASTPATH_PREBUILT=
ARG NATIVE_EXT_PREBUILT=
WORKDIR /src
COPY native ./native
RUN set -eux; \
    if [ -n "${FASTPATH_PREBUILT}" ]; then \
        install -D -m 0755 "${FASTPATH_PREBUILT}" /out/kubeserve-fastpath; \
    else \
        rm -rf native/target; \
        cargo build --release --locked --manifest-path native/Cargo.toml; \
        install -D -m 0755 native/target/release/kubeserve-fastpath /out/kubeserve-fastpath; \
    fi; \
    if [ -n "${NATIVE_EXT_PREBUILT}" ]; then \
        install -D -m 0644 "${NATIVE_EXT_PREBUILT}" /out/_native.abi3.so; \
    else \
        rm -rf native/pyext/target; \
        cargo build --release --locked --manifest-path native/pyext/Cargo.toml; \
        install -D -m 0644 native/pyext/target/release/lib_native.so /out/_native.abi3.so; \
    fi

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
    HOME=/home/kubeserve \
    KUBESERVE_FASTPATH_BINARY=/usr/local/bin/kubeserve-fastpath
COPY --from=build /wheels /wheels
COPY --from=native /out/kubeserve-fastpath /usr/local/bin/kubeserve-fastpath
COPY --from=native /out/_native.abi3.so /wheels/_native.abi3.so
RUN set -eux; \
    wheel="$(ls /wheels/kubeserve-*.whl)"; \
    pip install "${wheel}[kubernetes,tracing]"; \
    install -m 0644 /wheels/_native.abi3.so \
        "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kubeserve/"; \
    python3 -c 'import kubeserve._native'; \
    rm -rf /wheels; \
    # links against this image's C library (a binary built for a newer glibc stops here)
    if ldd /usr/local/bin/kubeserve-fastpath 2>&1 | grep 'not found'; then exit 1; fi; \
    groupadd --gid 10001 kubeserve; \
    useradd --uid 10001 --gid 10001 --home-dir /home/kubeserve --create-home --shell /usr/sbin/nologin kubeserve
WORKDIR /app
COPY --chown=10001:10001 examples ./examples
# Numeric, so runAsNonRoot can verify it without resolving names.
USER 10001:10001
EXPOSE 8000 8265
ENTRYPOINT ["kubeserve"]
CMD ["--help"]
