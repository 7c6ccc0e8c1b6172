#!/usr/bin/env bash
# A stand-in for the official `python:3.11-slim-bookworm` image, built from Debian's own
# packages where that image's registry cannot be reached (`make images` runs this when it
# cannot pull the official one; docs/deploy.md#images says when).
#
#   deploy/docker/debian-base.sh ENGINE IMAGE WORKDIR
#
# What it is: `debootstrap --variant=minbase` of Debian bookworm (the official image's release)
# with Debian's python3 (3.11.2: the same minor version as the project's 3.11 and the
# Dockerfile's PYTHON_VERSION; the official image builds 3.11.x from source into /usr/local,
# this one has Debian's at /usr/bin), python3-venv (ensurepip, which the Dockerfile's build
# stage uses to put uv in a venv of its own: PEP 668), libpython3.11 (the shared library Triton's
# Python backend links, for the compose check's Triton stand-in) and what the official image
# adds to Debian's slim one: ca-certificates, netbase, tzdata. Then trimmed as Debian's slim
# images are: no apt lists or package cache, no documentation, man pages or translations.
# `ENGINE import` turns the root filesystem into IMAGE (`CMD python3`, `LANG=C.UTF-8`).
#
# Must not: install anything on the host besides debootstrap, or leave the root filesystem
# behind (it is deleted once imported). Runs as root (debootstrap needs it).
set -euo pipefail

engine=${1:?usage: debian-base.sh ENGINE IMAGE WORKDIR}
image=${2:?usage: debian-base.sh ENGINE IMAGE WORKDIR}
workdir=${3:?usage: debian-base.sh ENGINE IMAGE WORKDIR}
release=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=python3,python3-venv,libpython3.11,ca-certificates,netbase,tzdata

if ! command -v debootstrap >/dev/null; then
  echo "debian-base: installing debootstrap from Debian" >&2
  apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

root="$workdir/rootfs"
rm -rf "$root"
mkdir -p "$workdir"
trap 'rm -rf "$root"' EXIT
echo "debian-base: debootstrap $release ($packages) from $mirror" >&2
debootstrap --variant=minbase --include="$packages" "$release" "$root" "$mirror" \
  >"$workdir/debootstrap.log" 2>&1 \
  || { tail -20 "$workdir/debootstrap.log" >&2; exit 1; }

# The minor version must be the one the Dockerfile names (python${PYTHON_VERSION}).
chroot "$root" python3.11 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'

# Slim, as Debian's slim images are: what a container never reads.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/var/log/*.log "$root"/var/log/apt/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +

tar --numeric-owner -C "$root" -c . \
  | "$engine" import \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["python3"]' \
      --message "debootstrap $release minbase + $packages (stand-in for python:3.11-slim-bookworm)" \
      - "$image" >"$workdir/import.log" 2>&1 \
  || { tail -20 "$workdir/import.log" >&2; exit 1; }
echo "debian-base: $image" >&2
