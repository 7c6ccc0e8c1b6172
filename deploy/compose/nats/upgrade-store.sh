#!/bin/sh
# Compose's nats entry point: the JetStream store of a deployment made before the accounts
# config moves to account SEEDANCE once, then the server starts with the arguments given.
#
#   upgrade-store.sh STORE_DIR [nats-server arguments...]
#
# nats-server keeps each account's streams (KV buckets and object stores too) and their
# consumers under STORE_DIR/jetstream/<account>. Before the accounts, every user, and so all of
# JetStream, was in the global account `$G`; now JetStream is in SEEDANCE, and a server on the
# old store would start with no stream at all (`seedance admin provision` then creating empty
# ones). On one server the directory is the whole of an account's JetStream state, so renaming
# it is the upgrade (tests/integration/deploy/test_store_upgrade.py). Only where SEEDANCE does
# not exist yet: a second start finds nothing to do, and a store holding both (a server of the
# new config started on it without this step) is left as it is, never merged: one line says so
# and the server starts on SEEDANCE (docs/deploy.md#upgrading-to-the-accounts-config).
# It must not run for a clustered server: there the meta layer's stream assignments name the
# account, and a renamed directory is not found (the Kubernetes procedure is in the docs).
# POSIX sh: the official image has busybox's, the compose-check stand-in Debian's dash.
set -eu

if [ "$#" -lt 1 ]; then
    echo "usage: upgrade-store.sh STORE_DIR [nats-server arguments...]" >&2
    exit 64
fi
jetstream="$1/jetstream"
shift
old="$jetstream/\$G"
new="$jetstream/SEEDANCE"

if [ -d "$old" ]; then
    if [ -e "$new" ]; then
        echo "seedance-nats: store_not_upgraded: $old and $new both exist; left as they are, the server uses $new" >&2
    else
        # one rename on one file system: the store is either wholly old or wholly moved
        mv "$old" "$new"
        echo "seedance-nats: store_upgraded: moved $old to $new (account \$G to SEEDANCE)" >&2
    fi
fi

exec nats-server "$@"
