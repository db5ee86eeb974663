# syntax=docker/dockerfile:1
# Multi-stage build of the harvester-cloud binary into a small non-root runtime image.
# Linted by hadolint in scripts/test.sh; no engine runs on the development machines, so
# scripts/docker-build-check.py runs the build stage's commands as written on a clean copy of the
# context (the CI toolchain is the base image's).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# BuildKit cache mounts keep the crate registry and the target directory between builds, so a
# source edit rebuilds only the crate and no hand-kept list of stub targets can fall out of step
# with the manifest. The binary is copied out of the cache mount (which is not part of the image).
# scripts/docker-build-check.py runs these commands as written in CI.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin harvester-cloud \
    && install -D -m 0755 target/release/harvester-cloud out/harvester-cloud

FROM debian:bookworm-slim
# ca-certificates: the Kubernetes backend and --kubeconfig endpoints are verified against the system
# roots. Not version-pinned (DL3008): Debian replaces a stable package's version with each point or
# security release, so a pin would break the build instead of picking up the fix.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 harvester-cloud \
    && useradd --system --uid 65532 --gid 65532 --no-log-init \
        --home-dir /var/lib/harvester-cloud --create-home --shell /usr/sbin/nologin harvester-cloud
COPY --from=build /src/out/harvester-cloud /usr/local/bin/harvester-cloud
USER 65532:65532
# Listen on all interfaces inside the pod: the API on 8443 (HTTPS), Prometheus metrics on 9090.
ENV HARVESTER_CLOUD_LISTEN=0.0.0.0:8443 \
    HARVESTER_CLOUD_METRICS_LISTEN=0.0.0.0:9090 \
    HARVESTER_CLOUD_DATA_DIR=/var/lib/harvester-cloud \
    HARVESTER_CLOUD_LOG_FORMAT=json
WORKDIR /var/lib/harvester-cloud
VOLUME ["/var/lib/harvester-cloud"]
EXPOSE 8443 9090
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz. The binary handles SIGTERM itself as PID 1.
ENTRYPOINT ["harvester-cloud"]
CMD ["serve"]
