#!/bin/sh
# Starts Postgres the way testcontainers' Postgres module and the official image's users
# expect: POSTGRES_USER / POSTGRES_DB are created, /docker-entrypoint-initdb.d/*.sql run
# (once, on the first start), arguments go to `postgres` (e.g. `-c fsync=off`), and the
# line "database system is ready to accept connections" appears on stderr (the server's)
# and on stdout (this script's) only once the server accepts TCP connections.
set -eu
ready="database system is ready to accept connections"
if [ ! -f "$PGDATA/.courier-initialised" ]; then
    # A private server on the Unix socket only, logging to a file: its readiness line
    # must not reach the container's output.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -l /tmp/init.log -w start >/dev/null
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    if [ "$user" != postgres ]; then
        psql -v ON_ERROR_STOP=1 -qAt -U postgres -d postgres \
            -c "CREATE ROLE \"$user\" SUPERUSER LOGIN"
    fi
    if [ "$db" != postgres ]; then
        psql -v ON_ERROR_STOP=1 -qAt -U postgres -d postgres -c "CREATE DATABASE \"$db\" OWNER \"$user\""
    fi
    for f in /docker-entrypoint-initdb.d/*.sql; do
        [ -e "$f" ] || continue
        psql -v ON_ERROR_STOP=1 -q -U "$user" -d "$db" -f "$f"
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    touch "$PGDATA/.courier-initialised"
fi
postgres "$@" &
pid=$!
trap 'kill -INT "$pid" 2>/dev/null' INT TERM
until pg_isready -q -h 127.0.0.1 -p 5432; do
    kill -0 "$pid" 2>/dev/null || { wait "$pid"; exit $?; }
    sleep 0.1
done
echo "$ready"
# `wait` returns early when a trapped signal arrives: wait until the server has exited.
status=0
while kill -0 "$pid" 2>/dev/null; do wait "$pid" || status=$?; done
exit "$status"
