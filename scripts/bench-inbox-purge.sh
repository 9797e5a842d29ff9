#!/usr/bin/env bash
# Measures the inbox retention cleanup at tens of millions of rows on Postgres: the table
# and indexes of migrations/postgres (courier.inbox with its (endpoint, processed_at)
# index), filled with ROWS records of which EXPIRED are past the retention; then the
# purge statement of PostgresStore::purge_inbox runs in batches of 1,000 (as the endpoint
# does) while pgbench inserts new inbox records the way handlers do, with 8 clients.
# Prints the purge's time per batch and the inserts' latency with and without it.
# Usage: scripts/bench-inbox-purge.sh [DATABASE_URL] [ROWS] [EXPIRED]
set -euo pipefail
url=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}}
rows=${2:-20000000}
expired=${3:-2000000}
schema=purge_bench_$$
work=$(mktemp -d)
trap 'psql "$url" -q -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null; rm -rf "$work"' EXIT

echo "filling $schema.inbox with $rows records ($expired expired)..."
start=$(date +%s)
psql "$url" -q -v ON_ERROR_STOP=1 <<SQL
CREATE SCHEMA $schema;
CREATE TABLE $schema.inbox (
    endpoint     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL,
    PRIMARY KEY (endpoint, message_id)
);
INSERT INTO $schema.inbox
SELECT 'billing', md5(g::text) || '-' || g,
       CASE WHEN g <= $expired THEN now() - interval '8 days' - (g || ' ms')::interval
            ELSE now() - ((g % 600000) || ' ms')::interval END
FROM generate_series(1, $rows) g;
CREATE INDEX ON $schema.inbox (endpoint, processed_at);
VACUUM ANALYZE $schema.inbox;
SQL
echo "filled in $(( $(date +%s) - start )) s; table + indexes: $(psql "$url" -Atc "SELECT pg_size_pretty(pg_total_relation_size('$schema.inbox'))")"

cat > "$work/insert.sql" <<SQL
INSERT INTO $schema.inbox (endpoint, message_id, processed_at)
VALUES ('billing', gen_random_uuid()::text, now()) ON CONFLICT DO NOTHING;
SQL
insert_latency() {
  pgbench "$url" -n -c 8 -j 2 -T "$1" -f "$work/insert.sql" 2>&1 |
    sed -n 's/^latency average = \(.*\)$/\1/p; s/^tps = \([0-9.]*\).*/\1 inserts\/s/p' | paste -sd' '
}
echo "inserts alone (8 clients, 10 s): $(insert_latency 10)"

purge() {
  local n total=0 batches=0 t0 t1
  t0=$(date +%s%N)
  while :; do
    n=$(psql "$url" -Atq -c "WITH d AS (DELETE FROM $schema.inbox WHERE ctid = ANY(ARRAY(
          SELECT ctid FROM $schema.inbox WHERE endpoint = 'billing'
          AND processed_at < now() - interval '7 days' LIMIT 1000)) RETURNING 1) SELECT count(*) FROM d")
    total=$((total + n)); batches=$((batches + 1))
    [ "$n" -lt 1000 ] && break
  done
  t1=$(date +%s%N)
  echo "purged $total records in $batches batches, $(( (t1 - t0) / 1000000 )) ms: $(( (t1 - t0) / 1000 / batches )) us per batch (each batch a psql process of its own)" > "$work/purge.out"
}
purge &
purger=$!
echo "inserts during the purge (8 clients, 10 s): $(insert_latency 10)"
wait $purger
cat "$work/purge.out"
