#!/usr/bin/env bash
# Raw-SQL baseline for what a PeekLock transport with per-message handlers does on Postgres,
# with no framework around it (issue 32). For each batch of n messages (n = 1, then 10):
#   1. the claim, a transaction of its own: one UPDATE that picks the n oldest unlocked
#      messages (FOR UPDATE SKIP LOCKED), sets their lock time and counts the delivery, so
#      that the lock outlives the transaction and the count survives a crash;
#   2. one transaction for the n messages: per message an inbox INSERT, a saga-row UPDATE
#      and the enqueue of a new 1 KiB message, each its own prepared statement and round
#      trip; then one DELETE of the n claimed messages; COMMIT.
# Each figure gets fresh tables (200,000 waiting messages of 1 KiB, 10,000 saga rows).
# Prints one line per figure: "peeklock baseline, N msg/tx, C clients: R messages/s".
# Compare a Courier figure with it only when Courier does the same work (an inbox record,
# one row updated, one 1 KiB message sent, per message), in the same run, on the same
# server, with as many handlers as this has clients.
# Usage: peeklock-baseline.sh [DATABASE_URL] [seconds] [clients]
# With PEEKLOCK_NOTIFY=1 each enqueue also calls pg_notify in its statement, as Courier's
# send does (the same statements and round trips otherwise): what the notification costs.
# With PEEKLOCK_SAVEPOINT=1 each message's statements run under a SAVEPOINT of their own,
# as a member of a commit group does (so that one member can roll back alone).
# With PEEKLOCK_BATCH=1, step 2 is what a batch handler does instead: ONE multi-row inbox
# INSERT for the n messages, ONE multi-row INSERT of one application row per message
# (no saga, no enqueue), the DELETE, COMMIT; "peeklock batch baseline" in its lines.
# Needs psql, pgbench and bc.
set -euo pipefail
# Plain connections, as Courier's are (its Postgres client has no TLS): libpq's default
# (sslmode=prefer) encrypts when the server has ssl on, which cost this baseline about a
# fifth of its rate on the project's machine (docs/measurements-postgres-gaps.md, "The
# baselines encrypted their connections").
export PGSSLMODE=${PGSSLMODE:-disable}
url=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}}
secs=${2:-15}
clients=${3:-8}
threads=$((clients < 2 ? clients : 2))
label="peeklock baseline"
enqueue="INSERT INTO q (payload) VALUES (repeat('y', 1000));"
if [ "${PEEKLOCK_NOTIFY:-0}" = 1 ]; then
  label="peeklock baseline with pg_notify"
  enqueue="WITH m AS (INSERT INTO q (payload) VALUES (repeat('y', 1000)) RETURNING id) SELECT pg_notify('peeklock', '1') FROM m;"
fi
schema=peeklock_$$
work=$(mktemp -d)
cleanup() {
  psql "$url" -q -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

batch=${PEEKLOCK_BATCH:-0}
[ "$batch" = 1 ] && label="peeklock batch baseline"
savepoint=""
if [ "${PEEKLOCK_SAVEPOINT:-0}" = 1 ]; then
  label="$label with a savepoint per message"
  savepoint="SAVEPOINT member;"
fi

# The pgbench script for batches of $1 messages: variables m1..mN hold the claimed ids.
transaction() {
  local n=$1 i vars="" ids="" rows=""
  for ((i = 1; i <= n; i++)); do
    vars+="${vars:+, }c.ids[$i] AS m$i"
    ids+="${ids:+, }:m$i"
    rows+="${rows:+, }(:m$i::bigint)"
  done
  cat <<SQL
WITH claimed AS (UPDATE q SET locked_until = now() + interval '30 seconds', deliveries = deliveries + 1 WHERE id IN (SELECT id FROM q WHERE locked_until < now() ORDER BY id LIMIT $n FOR UPDATE SKIP LOCKED) RETURNING id) SELECT $vars FROM (SELECT array_agg(id ORDER BY id) AS ids FROM claimed) c
\gset
BEGIN;
SQL
  if [ "$batch" = 1 ]; then
    cat <<SQL
INSERT INTO inbox (msg_id) VALUES $rows ON CONFLICT DO NOTHING;
INSERT INTO orders (n, bytes) SELECT v.n, 1000 FROM (VALUES $rows) AS v(n);
DELETE FROM q WHERE id IN ($ids);
COMMIT;
SQL
    return
  fi
  for ((i = 1; i <= n; i++)); do
    if [ -n "$savepoint" ]; then printf '%s\n' "$savepoint"; fi
    cat <<SQL
INSERT INTO inbox (msg_id) VALUES (:m$i) ON CONFLICT DO NOTHING;
UPDATE saga SET state = state + 1, version = version + 1 WHERE id = :m$i % 10000;
$enqueue
SQL
  done
  cat <<SQL
DELETE FROM q WHERE id IN ($ids);
COMMIT;
SQL
}

for n in 1 10; do
  psql "$url" -q -v ON_ERROR_STOP=1 <<SQL
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS $schema CASCADE;
CREATE SCHEMA $schema;
SET search_path = $schema;
CREATE TABLE q (id bigserial PRIMARY KEY, payload text NOT NULL,
                locked_until timestamptz NOT NULL DEFAULT '-infinity',
                deliveries integer NOT NULL DEFAULT 0);
CREATE TABLE inbox (msg_id bigint PRIMARY KEY);
CREATE TABLE saga (id integer PRIMARY KEY, state bigint NOT NULL DEFAULT 0, version integer NOT NULL DEFAULT 0);
CREATE TABLE orders (n bigint NOT NULL, bytes integer NOT NULL);
INSERT INTO saga (id) SELECT g FROM generate_series(0, 9999) g;
INSERT INTO q (payload) SELECT repeat('x', 1000) FROM generate_series(1, 200000);
VACUUM ANALYZE q;
VACUUM ANALYZE saga;
SQL
  transaction "$n" >"$work/peeklock$n.sql"
  out=$(PGOPTIONS="-c search_path=$schema" pgbench "$url" -n -M prepared -c "$clients" -j "$threads" -T "$secs" \
    -f "$work/peeklock$n.sql" 2>&1) || { printf '%s\n' "$out" >&2; exit 1; }
  tps=$(printf '%s\n' "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  [ -n "$tps" ] || { printf '%s\n' "$out" >&2; exit 1; }
  # Every handled message left its inbox row and one saga increment (one application row
  # in a batch): check the work was done.
  done_rows="SELECT sum(state) FROM $schema.saga"
  [ "$batch" = 1 ] && done_rows="SELECT count(*) FROM $schema.orders"
  handled=$(psql "$url" -Atq -c "SELECT (SELECT count(*) FROM $schema.inbox) = ($done_rows)")
  [ "$handled" = t ] || { echo "$label: inbox rows and the work done differ" >&2; exit 1; }
  printf '%s, %s msg/tx, %s clients: %.0f messages/s\n' "$label" "$n" "$clients" "$(echo "$tps * $n" | bc -l)"
done
