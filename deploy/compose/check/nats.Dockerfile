# Stand-in for `nats:2.15-alpine` in `make compose-check` only (that registry cannot be reached
# here): the pinned nats-server binary the tests run (`make install`, checked against
# tools/nats-server.sha256; the same minor line as compose's image, which
# tests/unit/deploy/test_compose.py pins) on the Seedance base image, with wget for compose's
# declared healthcheck (the official image has busybox's). Compose gives both images its own
# entry point (/bin/sh on nats/upgrade-store.sh, which execs `nats-server` from PATH with
# compose's `command`); the server's here is for a run outside compose.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends wget >/dev/null \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY nats-server /usr/local/bin/nats-server
ENTRYPOINT ["/usr/local/bin/nats-server"]
