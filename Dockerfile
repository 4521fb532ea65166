# syntax=docker/dockerfile:1
# tokenmeter in a small image: built in a Rust image, run from distroless (glibc, CA bundle, no
# shell) as the unprivileged `nonroot` user.
#   docker build -t tokenmeter .
#   docker run -p 8080:8080 -p 127.0.0.1:9090:9090 -e TOKENMETER_UPSTREAM=http://vllm:8000 tokenmeter
# Agents use http://HOST:8080/v1; the dashboard is http://127.0.0.1:9090/ (the admin listener:
# /stats, /stats/metrics, /healthz, /readyz), published on the host's loopback only.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --profile dist --locked --bin tokenmeter \
    && mkdir -p /out/log \
    && cp target/dist/tokenmeter /out/tokenmeter

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/tokenmeter /usr/local/bin/tokenmeter
COPY deploy/tokenmeter.toml /etc/tokenmeter/tokenmeter.toml
# The access log's directory, writable by nonroot (uid 65532); mount a volume here to keep it.
COPY --from=build --chown=65532:65532 /out/log /var/log/tokenmeter
USER nonroot
ENV TOKENMETER_LOG_FORMAT=json
# The admin listener on all of the container's interfaces, so a published port reaches it (the
# config's 127.0.0.1 is for a host install); publish it on the host's loopback, as above.
ENV TOKENMETER_ADMIN_LISTEN=0.0.0.0:9090
EXPOSE 8080 9090
VOLUME ["/var/log/tokenmeter"]
# Liveness of the proxy itself (whatever vLLM does): the main listener answers /stats/healthz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/tokenmeter", "healthcheck", "--url", "http://127.0.0.1:8080/stats/healthz"]
ENTRYPOINT ["/usr/local/bin/tokenmeter"]
CMD ["serve", "--config", "/etc/tokenmeter/tokenmeter.toml", "--access-log", "/var/log/tokenmeter/access.jsonl"]
