# syntax=docker/dockerfile:1
# Multi-stage build of the harvester-cloud binary into a small non-root runtime image.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so that source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY crates/kube-fake/Cargo.toml crates/kube-fake/Cargo.toml
RUN mkdir -p src crates/kube-fake/src benches \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > crates/kube-fake/src/main.rs && touch crates/kube-fake/src/lib.rs \
    && echo 'fn main() {}' > benches/http_load.rs && echo 'fn main() {}' > benches/ipam.rs \
    && cargo build --release --locked --bin harvester-cloud \
    && rm -rf src crates/kube-fake/src benches
COPY . .
# The stub build left artefacts newer than nothing; make sure the real sources are rebuilt.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin harvester-cloud \
    && install -D -m 0755 target/release/harvester-cloud /out/harvester-cloud

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 65532 --home-dir /var/lib/harvester-cloud --create-home harvester-cloud
COPY --from=build /out/harvester-cloud /usr/local/bin/harvester-cloud
USER 65532:65532
ENV HARVESTER_CLOUD_LISTEN=0.0.0.0:8443 \
    HARVESTER_CLOUD_DATA_DIR=/var/lib/harvester-cloud \
    HARVESTER_CLOUD_LOG_FORMAT=json
WORKDIR /var/lib/harvester-cloud
VOLUME ["/var/lib/harvester-cloud"]
EXPOSE 8443
ENTRYPOINT ["harvester-cloud"]
CMD ["serve"]
