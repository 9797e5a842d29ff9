#!/usr/bin/env bash
# The test command (the README's second): sets up what the suite needs and runs it with
# its servers in containers.
#
#   scripts/test.sh [cargo test arguments]      (default: --workspace)
#
# 1. A Docker engine: the one DOCKER_HOST or the default socket names; else, as root, it
#    installs docker.io and debootstrap with apt when missing and starts dockerd on a
#    socket of its own (/run/courier-test-docker.sock), stopped again at the end.
#    Without root and without an engine it says in one line what to install.
# 2. The test images (containers/build.sh: built once, reused while their files are
#    unchanged).
# 3. `cargo test` with DATABASE_URL and AMQP_URL unset: each test binary starts one
#    Postgres and one RabbitMQ container (tests/src/containers.rs).
# 4. At the end, failed or not: the test containers of exited processes are removed.
#
# `cargo test --workspace` alone also works: against DATABASE_URL / AMQP_URL, or an engine
# that answers. See docs/containers.md.
set -euo pipefail
cd "$(dirname "$0")/.."

phase_start=$SECONDS
timings=()
phase_done() { timings+=("$1: $((SECONDS - phase_start)) s"); phase_start=$SECONDS; }
say() { printf '==> %s\n' "$*" >&2; }

private_socket=/run/courier-test-docker.sock
started_pid=""
forward_policy=""

engine_answers() { docker info >/dev/null 2>&1; }

cleanup() {
    local status=$?
    if command -v docker >/dev/null && engine_answers; then
        # Test containers whose process has exited (all of this run's, by now).
        docker ps -a --filter label=courier.test.owner --format '{{.ID}} {{.Label "courier.test.owner"}}' |
            while read -r id pid; do
                [ -d "/proc/$pid" ] || docker rm -f -v "$id" >/dev/null || true
            done
    fi
    if [ -n "$started_pid" ]; then
        say "stopping the dockerd this script started (pid $started_pid)"
        kill "$started_pid" 2>/dev/null || true
        for _ in $(seq 1 60); do kill -0 "$started_pid" 2>/dev/null || break; sleep 0.5; done
        # dockerd sets the FORWARD policy to DROP and leaves it: put back what was there.
        if [ -n "$forward_policy" ] && command -v iptables >/dev/null; then
            iptables -P FORWARD "$forward_policy" 2>/dev/null || true
        fi
    fi
    if [ "${#timings[@]}" -gt 0 ]; then
        say "timings: $(IFS=';'; echo "${timings[*]}")"
    fi
    exit "$status"
}
trap cleanup EXIT

# --- 1. the engine ----------------------------------------------------------------------
if command -v docker >/dev/null && engine_answers; then
    say "Docker engine: ${DOCKER_HOST:-the default socket}"
elif [ -z "${DOCKER_HOST:-}" ] && [ -S "$private_socket" ] &&
    DOCKER_HOST="unix://$private_socket" docker info >/dev/null 2>&1; then
    export DOCKER_HOST="unix://$private_socket"
    say "Docker engine: $DOCKER_HOST (started earlier by this script)"
else
    if [ "$(id -u)" != 0 ]; then
        echo "scripts/test.sh needs a Docker engine: install and start Docker (Debian: sudo apt-get install docker.io debootstrap), or run it as root to have it set up; or set DATABASE_URL and AMQP_URL and run cargo test --workspace" >&2
        exit 1
    fi
    if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
        say "installing docker.io and debootstrap with apt"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq docker.io debootstrap >/dev/null
        phase_done "engine install"
    fi
    if command -v iptables >/dev/null; then
        forward_policy="$(iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" { print $3; exit }')"
    fi
    log="${TMPDIR:-/tmp}/courier-test-dockerd.log"
    say "starting dockerd on $private_socket (log: $log)"
    dockerd -H "unix://$private_socket" --pidfile /run/courier-test-docker.pid >"$log" 2>&1 &
    started_pid=$!
    export DOCKER_HOST="unix://$private_socket"
    for _ in $(seq 1 120); do engine_answers && break; sleep 0.5; done
    engine_answers || { echo "dockerd did not answer within 60 s; its log: $log" >&2; exit 1; }
    phase_done "engine start"
fi

# --- 2. the images ----------------------------------------------------------------------
# The base image is made with debootstrap (only when it is missing: containers/build.sh).
if ! command -v debootstrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing debootstrap with apt"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
base="$(bash containers/build.sh base)"
phase_done "base image ($base)"
if [ -z "${COURIER_TEST_POSTGRES_IMAGE:-}" ]; then
    COURIER_TEST_POSTGRES_IMAGE="$(bash containers/build.sh postgres)"
    export COURIER_TEST_POSTGRES_IMAGE
    phase_done "postgres image ($COURIER_TEST_POSTGRES_IMAGE)"
fi
if [ -z "${COURIER_TEST_RABBITMQ_IMAGE:-}" ]; then
    COURIER_TEST_RABBITMQ_IMAGE="$(bash containers/build.sh rabbitmq)"
    export COURIER_TEST_RABBITMQ_IMAGE
    phase_done "rabbitmq image ($COURIER_TEST_RABBITMQ_IMAGE)"
fi

# --- 3. the suite -----------------------------------------------------------------------
[ "$#" -gt 0 ] || set -- --workspace
say "cargo test $* (servers in containers)"
status=0
env -u DATABASE_URL -u AMQP_URL cargo test "$@" || status=$?
phase_done "the suite"
exit "$status"
