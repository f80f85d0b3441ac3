# llmserve in a container: an OpenAI-compatible server on port 8080 for the
# GGUF model mounted at /models/model.gguf.
#
#   docker build -t llmserve .
#   docker run --rm -p 8080:8080 -v /path/to/dir-with-model:/models:ro llmserve
#   docker run --rm -p 8080:8080 -v "$PWD/models:/models:ro" llmserve \
#       llmserve serve --host 0.0.0.0 --model /models/other.gguf --api-key KEY
#
# The build stage compiles a release build with meson (tests off: the test
# data lives outside the repository); the runtime stage holds only the binary
# and the shared libraries it links, and runs as an unprivileged user. The
# SIMD kernels are chosen at run time, so the image runs on any x86-64 CPU.

# ---- build ------------------------------------------------------------------
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        build-essential meson ninja-build pkg-config \
        libopenblas-dev libjansson-dev libmicrohttpd-dev libuv1-dev libpcre2-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN meson setup /build --buildtype=release -Dtests=false --prefix=/usr/local \
 && ninja -C /build \
 && meson install -C /build --destdir /out

# ---- runtime ------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        libopenblas0-pthread libjansson4 libmicrohttpd12 libuv1 libpcre2-8-0 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin llmserve \
 && mkdir -p /models
COPY --from=build /out/usr/local/ /usr/local/
# Fail the build here, not at first start, if a shared library is missing.
RUN ! ldd /usr/local/bin/llmserve | grep -q 'not found'
USER llmserve
VOLUME ["/models"]
EXPOSE 8080
# SIGTERM (docker stop) drains: running requests finish within --shutdown-grace
# (10 s by default, the same as docker stop's default timeout), then exit 0.
STOPSIGNAL SIGTERM
CMD ["llmserve", "serve", "--host", "0.0.0.0", "--port", "8080", "--model", "/models/model.gguf"]
