# zerolayer's container image: the four binaries (zl, zl-worker, zl-orchestrator, zl-frontend), the shared
# libraries they load, CA certificates and a non-root user (65532), from scratch: no shell, no package manager.
# The root file system is assembled by scripts/image-rootfs, the same script scripts/image uses to build this
# image without a container engine (umoci; what CI does, and what e2e/tests/image.rs runs from under chroot).
#
#   docker build -t zerolayer:0.1.0 .
#   docker run --rm zerolayer:0.1.0                      # zl version
#   docker run --rm --entrypoint zl-worker zerolayer:0.1.0 serve --help
#
# The build stage is Debian bookworm with the Rust this repository is built and tested with (1.95), so the
# libraries copied are bookworm's glibc 2.36, as in the image scripts/image builds on this project's machines.
# Not run here (no container engine on these machines); scripts/image is.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bins \
    && scripts/image-rootfs target/release /rootfs

FROM scratch
COPY --from=build /rootfs /
USER 65532:65532
WORKDIR /home/zerolayer
ENV PATH=/usr/local/bin HOME=/home/zerolayer SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LABEL org.opencontainers.image.title=zerolayer org.opencontainers.image.licenses=Apache-2.0
ENTRYPOINT ["/usr/local/bin/zl"]
CMD ["version"]
