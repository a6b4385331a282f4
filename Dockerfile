# The image the Helm chart and the operator run: `tandem` (router and workers; the entrypoint)
# and `tandem-operator`. Workers without a model path fetch the default model with pip.
FROM rust:1.88-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p tandem-cli -p tandem-operator

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/tandem /src/target/release/tandem-operator /usr/local/bin/
ENV TANDEM_CACHE_DIR=/var/cache/tandem
USER 65532
ENTRYPOINT ["tandem"]
