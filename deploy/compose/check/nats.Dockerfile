# Stand-in for `nats:2.15-alpine` in `make compose-check` only (that registry cannot be reached
# here): the pinned nats-server binary the tests run (`make install`, checked against
# tools/nats-server.sha256; the same minor line as compose's image, which
# tests/unit/deploy/test_compose.py pins) on the Seedance base image, with wget for compose's
# declared healthcheck (the official image has busybox's). The entry point is the server, so
# compose's `command: ["-c", ...]` runs as it does with the official image, whose entry point
# prepends `nats-server` to arguments that start with '-'.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends wget >/dev/null \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY nats-server /usr/local/bin/nats-server
ENTRYPOINT ["/usr/local/bin/nats-server"]
