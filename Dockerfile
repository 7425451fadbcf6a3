# The llmslo image the chart and the injector use: the release binary on distroless, as the
# non-root user 65532 that the injected sidecar's securityContext asks for.
#   docker build -t ghcr.io/llmslo/llmslo:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && strip target/release/llmslo

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/llmslo /usr/local/bin/llmslo
USER 65532:65532
EXPOSE 8080 9464 8443
ENTRYPOINT ["/usr/local/bin/llmslo"]
