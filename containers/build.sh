#!/usr/bin/env bash
# Builds one of Courier's test images when it is missing and prints its reference.
#
#   containers/build.sh base|postgres|rabbitmq
#
# Tags are content-addressed: the first 16 hex digits of a SHA-256 over the files of the
# image's directory (and, for the servers, the base's reference), so a changed file makes
# a new image and an unchanged one is reused. Nothing is pulled from a registry: the base
# is made with debootstrap from Debian's mirror (root needed, once), the servers install
# Debian's packages on top of it. Build logs go to stderr; stdout holds the reference only.
# The engine is the one `docker` talks to (DOCKER_HOST when set).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
what="${1:?usage: containers/build.sh base|postgres|rabbitmq}"

# The hash of a directory's files (names and contents), plus any extra words.
content_hash() {
    local dir="$1"; shift
    { (cd "$dir" && find . -type f | LC_ALL=C sort | xargs sha256sum); printf '%s\n' "$@"; } |
        sha256sum | cut -c1-16
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# Builds under a lock: tests of one run may ask for the same image at the same time.
exec 9>"${TMPDIR:-/tmp}/courier-test-images.lock"
flock 9

base() {
    local ref
    ref="courier-test-base:$(content_hash "$here/base")"
    if ! have_image "$ref"; then
        if [ "$(id -u)" != 0 ] || ! command -v debootstrap >/dev/null; then
            echo "building $ref needs root and debootstrap (apt-get install debootstrap), or run scripts/test.sh as root" >&2
            exit 1
        fi
        local root start=$SECONDS
        root="$(mktemp -d "${TMPDIR:-/tmp}/courier-test-base.XXXXXX")"
        trap 'rm -rf "$root"' EXIT
        echo "building $ref with debootstrap (about 30 s)" >&2
        "$here/base/debootstrap.sh" "$root"
        tar -C "$root" -c . | docker import - "$ref" >&2
        rm -rf "$root"
        trap - EXIT
        echo "built $ref in $((SECONDS - start)) s" >&2
    fi
    echo "$ref"
}

server() {
    local name="$1" base_ref ref
    base_ref="$(base)"
    ref="courier-test-$name:$(content_hash "$here/$name" "$base_ref")"
    if ! have_image "$ref"; then
        local start=$SECONDS
        echo "building $ref from containers/$name/Containerfile" >&2
        docker build --build-arg "BASE=$base_ref" -f "$here/$name/Containerfile" -t "$ref" \
            --label courier.test.image="$name" "$here/$name" >&2
        echo "built $ref in $((SECONDS - start)) s" >&2
    fi
    echo "$ref"
}

case "$what" in
    base) base ;;
    postgres | rabbitmq) server "$what" ;;
    *) echo "unknown image $what: base, postgres or rabbitmq" >&2; exit 2 ;;
esac
