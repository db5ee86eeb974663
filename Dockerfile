# syntax=docker/dockerfile:1
# Multi-stage build of the harvester-cloud binary into a small non-root runtime image.
# Linted by hadolint in scripts/test.sh; it cannot be built on the development machines (no engine).

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so that source edits do not rebuild them: a build of stub targets with the real
# manifests and lockfile compiles and caches every dependency.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > benches/http_load.rs && echo 'fn main() {}' > benches/ipam.rs \
    && cargo build --release --locked --bin harvester-cloud \
    && rm -rf src benches
COPY . .
# COPY keeps the sources' modification times, which can be older than the stub build's outputs;
# touching the crate roots makes cargo rebuild the real crate (migrations/, templates/ and
# openapi/ are compiled in through it).
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin harvester-cloud \
    && install -D -m 0755 target/release/harvester-cloud /out/harvester-cloud

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
COPY --from=build /out/harvester-cloud /usr/local/bin/harvester-cloud
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
