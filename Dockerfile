# prefixd container image.
#
# GPU (default):  docker build -t prefixd .
# CPU only:       docker build -t prefixd-cpu --build-arg BUILD_IMAGE=debian:12 \
#                   --build-arg RUNTIME_IMAGE=debian:12-slim --build-arg PREFIXD_CUDA=OFF .
# Run:            docker run --gpus all --stop-timeout 40 -p 50051:50051 -p 8000:8000 -p 9464:9464 \
#                   -v ~/models/gpt2:/models/gpt2:ro prefixd
# Demo model:     docker run --stop-timeout 40 -p 50051:50051 -p 8000:8000 -p 9464:9464 prefixd --demo
# (--stop-timeout 40: the 30 s drain and 5 s to flush streams, before Docker's SIGKILL)
#
# The CUDA 13 images are Ubuntu 24.04 based; it ships the same gRPC/protobuf/absl versions as
# Debian 12, so scripts/setup works unchanged on both.
ARG BUILD_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

# ---- build -----------------------------------------------------------------------------------
FROM ${BUILD_IMAGE} AS build
ARG PREFIXD_CUDA=AUTO
# Only the deployment target's architecture by default: 90 = H100/H200.
ARG CUDA_ARCHITECTURES=90
ARG JOBS=2
ENV DEBIAN_FRONTEND=noninteractive PREFIXD_SETUP_NO_TEST_DEPS=1
WORKDIR /src
# Packages first, in their own layer, so source edits do not reinstall them.
COPY scripts/setup scripts/setup
RUN PREFIXD_SETUP_PACKAGES_ONLY=1 scripts/setup
COPY . .
# Fetches the tokenizer files unless .deps/gpt2-tokenizer came with the context.
RUN scripts/setup \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPREFIXD_BUILD_TESTS=OFF \
      -DPREFIXD_CUDA=${PREFIXD_CUDA} -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES} \
 && cmake --build build -j ${JOBS} --target prefixd prefixctl prefixd-model \
 && scripts/stage-install build /opt/prefixd

# ---- runtime ---------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE}
# Binaries plus the shared libraries they need that a bare base image lacks (copied by
# scripts/stage-install), so the runtime image installs no packages.
COPY --from=build /opt/prefixd /opt/prefixd
RUN useradd --system --uid 10001 --home-dir /var/lib/prefixd --create-home prefixd
ENV PATH=/opt/prefixd/bin:$PATH \
    LD_LIBRARY_PATH=/opt/prefixd/lib \
    PREFIXD_TOKENIZER_DIR=/opt/prefixd/share/gpt2-tokenizer
USER prefixd
EXPOSE 50051 8000 9464
VOLUME ["/models"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["prefixctl", "--server", "127.0.0.1:50051", "health"]
ENTRYPOINT ["/opt/prefixd/bin/prefixd-entrypoint"]
CMD ["--model", "/models/gpt2"]
