# Stand-in for `prom/prometheus` in `make compose-check` only (that registry cannot be reached
# here): Debian's prometheus package (the one tests/e2e/test_dashboards_prometheus.py runs) on
# the Seedance base image. The entry point is the binary, as in the official image, so compose's
# `command:` (the flags) runs unchanged.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin && mkdir -p /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
