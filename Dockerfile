# The llmslo image the chart and the injector use: the release binary on distroless, as the
# non-root user 65532 that the injected sidecar's securityContext asks for. llmslo publishes no
# image; build and push your own:
#   docker build -t REGISTRY/llmslo:0.1.0 . && docker push REGISTRY/llmslo:0.1.0
FROM rust:1.95-bookworm AS build
WORKDIR /src

# Dependencies first, in a layer of their own: it is rebuilt only when Cargo.toml or
# Cargo.lock change, so a code change recompiles llmslo alone. Cargo needs every target that
# Cargo.toml declares to exist, so placeholders stand in for ours, one per declared target.
COPY Cargo.toml Cargo.lock ./
COPY scripts/cargo-stubs.sh /usr/local/bin/cargo-stubs
RUN cargo-stubs Cargo.toml \
    && cargo build --release --locked \
    && rm -rf src benches tests examples \
              target/release/.fingerprint/llmslo-* target/release/deps/llmslo-* \
              target/release/deps/libllmslo-* target/release/llmslo*

COPY . .
RUN cargo build --release --locked && strip target/release/llmslo

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/llmslo /usr/local/bin/llmslo
USER 65532:65532
EXPOSE 8080 9464 8443
ENTRYPOINT ["/usr/local/bin/llmslo"]
