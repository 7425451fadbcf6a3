# The llmslo image the chart and the injector use: the release binary on distroless, as the
# non-root user 65532 that the injected sidecar's securityContext asks for. llmslo publishes no
# image; build and push your own:
#   docker build -t REGISTRY/llmslo:0.1.0 . && docker push REGISTRY/llmslo:0.1.0
FROM rust:1.95-bookworm AS build
WORKDIR /src

# The binary is built with profile-guided optimisation (scripts/pgo-build.sh): an instrumented
# build proxies a short streaming load, and the release build is optimised with its profile.
# llvm-profdata, which merges the profile, comes with rustup's llvm-tools.
RUN rustup component add llvm-tools

# The instrumented build's dependencies first, in a layer of their own: it is rebuilt only when
# Cargo.toml or Cargo.lock change. (The optimised build cannot be cached so: its profile comes
# from the code.) Cargo needs every target that Cargo.toml declares to exist, so placeholders
# stand in for ours, one per declared target.
COPY Cargo.toml Cargo.lock ./
COPY scripts/cargo-stubs.sh /usr/local/bin/cargo-stubs
COPY scripts/pgo-build.sh scripts/pgo-build.sh
RUN cargo-stubs Cargo.toml \
    && scripts/pgo-build.sh --instrument-only --locked \
    && rm -rf src benches tests examples \
              target/pgo/instrumented/release/.fingerprint/llmslo-* \
              target/pgo/instrumented/release/deps/llmslo-* \
              target/pgo/instrumented/release/deps/libllmslo-* \
              target/pgo/instrumented/release/llmslo*

COPY . .
RUN scripts/pgo-build.sh --locked && strip target/release/llmslo

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/llmslo /usr/local/bin/llmslo
USER 65532:65532
EXPOSE 8080 9464 8443
ENTRYPOINT ["/usr/local/bin/llmslo"]
