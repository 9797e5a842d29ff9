#!/usr/bin/env bash
# The base of Courier's test images: a minimal Debian bookworm made with debootstrap from
# Debian's mirror (no image registry needed). Usage: debootstrap.sh ROOT (an empty
# directory); containers/build.sh imports ROOT as courier-test-base:<hash>.
set -euo pipefail
root="$1"
mirror="${COURIER_TEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
debootstrap --variant=minbase bookworm "$root" "$mirror" >&2
# Smaller: no package lists, documentation or apt cache in the base.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* "$root"/usr/share/man/*
# apt inside `docker build` must not start services.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
