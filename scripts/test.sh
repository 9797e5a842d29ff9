#!/usr/bin/env bash
# The test command (the README's second): sets up what the suite needs and runs it with
# its servers in containers.
#
#   scripts/test.sh [cargo test arguments]      (default: --workspace --features courier-examples/servers)
#
# 1. A Docker engine: the one DOCKER_HOST or the default socket names; else, as root, it
#    installs docker.io (and debootstrap, when an image is to be built) with apt when
#    missing and starts dockerd on a socket of its own (/run/courier-test-docker.sock),
#    stopped again at the end. Without root and without an engine it says in one line
#    what to install.
# 2. The test images (containers/build.sh: built once, reused while their files are
#    unchanged), those COURIER_TEST_POSTGRES_IMAGE / COURIER_TEST_RABBITMQ_IMAGE do not
#    name: with both set (e.g. the official images, where a registry is reachable)
#    nothing is built, and neither root nor debootstrap is needed.
# 3. Headless Chromium and chromedriver (Debian's chromium, chromium-driver) for the web
#    console's browser tests: installed with apt as root when missing; and psycopg (pip)
#    for the Python example of docs/postgres.md.
# 4. `cargo test` with DATABASE_URL and AMQP_URL unset: each test binary starts one
#    Postgres and one RabbitMQ container (tests/src/containers.rs).
# 5. At the end, failed or not: the test containers of exited processes are removed (each
#    is also removed by its own watcher once its test process ends; this makes sure it is
#    done before a dockerd started here is stopped).
#
# `cargo test --workspace` alone also works: against DATABASE_URL / AMQP_URL, or an engine
# that answers (without the example's servers feature it leaves out the sign-up example's
# test on Postgres). See docs/containers.md.
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

# The ids of the test containers whose process has exited.
ended_containers() {
    docker ps -a --filter label=courier.test.owner --format '{{.ID}} {{.Label "courier.test.owner"}}' |
        while read -r id pid; do
            [ -d "/proc/$pid" ] || printf '%s ' "$id"
        done
}

# The images to build: those not named.
to_build=()
[ -n "${COURIER_TEST_POSTGRES_IMAGE:-}" ] || to_build+=(postgres)
[ -n "${COURIER_TEST_RABBITMQ_IMAGE:-}" ] || to_build+=(rabbitmq)

cleanup() {
    local status=$?
    if command -v docker >/dev/null && engine_answers; then
        # Test containers whose process has exited (all of this run's, by now): their
        # watchers may be removing them already; wait (at most 60 s) until they are gone.
        for _ in $(seq 1 120); do
            ended="$(ended_containers)"
            [ -n "$ended" ] || break
            # shellcheck disable=SC2086
            docker rm -f -v $ended >/dev/null 2>&1 || true
            sleep 0.5
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
    packages=(docker.io)
    [ "${#to_build[@]}" -eq 0 ] || packages+=(debootstrap)
    if [ "$(id -u)" != 0 ]; then
        echo "scripts/test.sh needs a Docker engine: install and start Docker (Debian: sudo apt-get install ${packages[*]}), or run it as root to have it set up; or set DATABASE_URL and AMQP_URL and run cargo test --workspace" >&2
        exit 1
    fi
    missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    if [ "${#to_build[@]}" -gt 0 ] && ! command -v debootstrap >/dev/null; then missing+=(debootstrap); fi
    if [ "${#missing[@]}" -gt 0 ]; then
        say "installing ${missing[*]} with apt"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${missing[@]}" >/dev/null
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
if [ "${#to_build[@]}" -eq 0 ]; then
    say "images named: $COURIER_TEST_POSTGRES_IMAGE, $COURIER_TEST_RABBITMQ_IMAGE (nothing to build)"
else
    # The base image is made with debootstrap (only when it is missing: containers/build.sh).
    if ! command -v debootstrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing debootstrap with apt"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    fi
    base="$(bash containers/build.sh base)"
    phase_done "base image ($base)"
    for server in "${to_build[@]}"; do
        reference="$(bash containers/build.sh "$server")"
        case "$server" in
            postgres) export COURIER_TEST_POSTGRES_IMAGE="$reference" ;;
            rabbitmq) export COURIER_TEST_RABBITMQ_IMAGE="$reference" ;;
        esac
        phase_done "$server image ($reference)"
    done
fi

# --- 3. the browser ---------------------------------------------------------------------
# The web console's tests (cli/tests/console/) drive a headless Chromium through
# chromedriver: as root, install Debian's packages when missing; otherwise those tests
# fail saying what to install.
if ! command -v chromedriver >/dev/null || ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing chromium and chromium-driver with apt (the console's browser tests)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq chromium chromium-driver >/dev/null
        phase_done "browser install"
    else
        say "no chromium/chromedriver: the console's browser tests will fail (Debian: sudo apt-get install chromium chromium-driver)"
    fi
fi

# psycopg (PyPI) runs the Python example of docs/postgres.md ("Messages from other
# producers", tests/transport/pg_send_function.rs); without it the test only parses it.
if command -v python3 >/dev/null && ! python3 -c "import psycopg" 2>/dev/null; then
    say "installing psycopg with pip (the Python example of docs/postgres.md)"
    python3 -m pip install -q "psycopg[binary]" ||
        say "pip could not install psycopg: the Python example of docs/postgres.md will only be parsed"
fi

# --- 4. the suite -----------------------------------------------------------------------
# The example's servers (its RabbitMQ + Postgres modes, examples/tests/signup_postgres.rs)
# are a feature of courier-examples, off for the README's first command.
[ "$#" -gt 0 ] || set -- --workspace --features courier-examples/servers
say "cargo test $* (servers in containers)"
status=0
env -u DATABASE_URL -u AMQP_URL cargo test "$@" || status=$?
phase_done "the suite"
exit "$status"
