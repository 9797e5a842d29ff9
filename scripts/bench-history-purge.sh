#!/usr/bin/env bash
# Measures the history's retention purge (issue 33, docs/history.md "Cost") at 10 million
# events on Postgres: the tables and indexes of the history migrations
# (migrations/postgres/*history*.sql: courier.history and courier.history_instance,
# created in a schema of their own, dropped at exit), filled with ROWS events of which
# EXPIRED are past the retention, 6 in 10 of them a saga's (its instance in the event's
# row since migration 20261208000001, in a history_instance row before it).
# Then the purge statement of pg_history.rs `purge` runs in batches of 1,000, each batch a
# transaction of its own, oldest first, as the endpoint's janitor does, while pgbench
# writes handled events the way a handling does (an event with its instance, in one
# transaction), with 8 clients. Prints the plan of one batch, the purge's time per batch
# and the inserts' latency with and without it.
#
# Usage: scripts/bench-history-purge.sh [DATABASE_URL] [ROWS] [EXPIRED]
#   MIGRATIONS=first  only the first history migration (20261203000001_history.sql), to
#                     compare with what the later ones changed
#   SQLITE_ROWS=N     also the SQLite purge (sqlite_history.rs `purge`) on a file of N
#                     events (0: not measured; default 1000000)
set -euo pipefail
url=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}}
rows=${2:-10000000}
expired=${3:-1000000}
sqlite_rows=${SQLITE_ROWS:-1000000}
here=$(cd "$(dirname "$0")/.." && pwd)
schema=history_purge_bench_$$
work=$(mktemp -d)
trap 'psql "$url" -q -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null; rm -rf "$work"' EXIT

migrations=$(ls "$here"/migrations/postgres/*.sql | sort | while read -r f; do
  case $(basename "$f") in
    20261203000001_history.sql) echo "$f" ;;
    *) if [ "${MIGRATIONS:-all}" != first ] && [[ $(basename "$f") > 20261203000001 ]] &&
          grep -q 'courier\.history' "$f"; then echo "$f"; fi ;;
  esac
done)
echo "schema $schema from: $(for f in $migrations; do basename "$f"; done | paste -sd' ')"
uptime

# The migrations into the bench's schema; the secondary indexes are dropped while the
# table fills and built again after it (as a bulk load would), the foreign key is not
# checked row by row while it fills (session_replication_role), and both are as the
# migrations made them when the purge runs.
{
  echo "CREATE SCHEMA $schema;"
  for f in $migrations; do sed "s/courier\./$schema./g" "$f"; done
} | psql "$url" -q -v ON_ERROR_STOP=1 >/dev/null
psql "$url" -Atq -c "SELECT indexdef || ';' FROM pg_indexes WHERE schemaname = '$schema'
  AND indexname NOT IN (SELECT conname FROM pg_constraint WHERE connamespace = '$schema'::regnamespace)" > "$work/indexes.sql"
# Whether an event's first saga instance is in its own row (20261208000001), or in a
# history_instance row as before.
inline=$(psql "$url" -Atc "SELECT count(*) FROM information_schema.columns
  WHERE table_schema = '$schema' AND table_name = 'history' AND column_name = 'saga_type'")
if [ "$inline" = 1 ]; then
  fill_columns=", saga_type, correlation"
  fill_values=", CASE WHEN g % 10 < 6 THEN 'shop.Checkout' END, CASE WHEN g % 10 < 6 THEN 'cart-' || (g / 3) END"
  fill_instances=""
  insert_columns=", saga_type, correlation"
  insert_values=", 'shop.Checkout', 'cart-' || :cart"
  insert_instance=""
else
  fill_columns="" fill_values="" insert_columns="" insert_values=""
  fill_instances="INSERT INTO $schema.history_instance (history_id, saga_type, correlation)
SELECT g, 'shop.Checkout', 'cart-' || (g / 3) FROM generate_series(1, $rows) g WHERE g % 10 < 6;"
  insert_instance="INSERT INTO $schema.history_instance (history_id, saga_type, correlation)
SELECT currval('$schema.history_id_seq'), 'shop.Checkout', 'cart-' || :cart;"
fi
echo "filling $schema.history with $rows events ($expired past the retention; instances in the event's row: $inline)..."
start=$(date +%s)
psql "$url" -q -v ON_ERROR_STOP=1 <<SQL
$(sed -E 's/^CREATE INDEX ([a-z_]+) .*/DROP INDEX '"$schema"'.\1;/' "$work/indexes.sql")
SET session_replication_role = replica;
-- A message id as Courier makes them (a UUIDv7: its time in milliseconds first, then
-- random bits), so that ids rise with time as they do in the indexes of a real history.
CREATE FUNCTION $schema.v7(t timestamptz, salt bigint) RETURNS text LANGUAGE sql IMMUTABLE AS
  \$\$ SELECT lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '-7' || substr(md5(salt::text), 1, 21) \$\$;
-- Events every few seconds over 30 days, in the order they were written (id and time
-- rise together); the first EXPIRED are older than 30 days. A saga's event (6 in 10) holds
-- its state before and after; the others what they sent.
INSERT INTO $schema.history (id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id,
                             attempt, enqueued_at, received_at, detail$fill_columns)
SELECT g, 'orders', CASE WHEN g % 50 = 0 THEN 'retried' ELSE 'handled' END, t,
       $schema.v7(t, g), 'shop.PaymentReceived', $schema.v7(t - (g % 5) * interval '10 ms', g - g % 5),
       $schema.v7(t - interval '10 ms', g - 1), 1,
       t - interval '20 ms', t - interval '5 ms',
       CASE WHEN g % 10 < 6 THEN jsonb_build_object('sagas', jsonb_build_array(jsonb_build_object(
              'saga_type', 'shop.Checkout', 'correlation', 'cart-' || (g / 3),
              'before', '{"cart":"cart-' || (g / 3) || '","items":["a","b"],"paid":false,"note":"' || repeat('n', 100) || '"}',
              'after', '{"cart":"cart-' || (g / 3) || '","items":["a","b"],"paid":true,"note":"' || repeat('n', 100) || '"}')))
            ELSE jsonb_build_object('sent', jsonb_build_array(jsonb_build_object(
              'message_id', $schema.v7(t, g + 1), 'message_type', 'shop.Ship', 'destination', 'shipping')))
       END$fill_values
FROM generate_series(1, $rows) g,
     LATERAL (SELECT CASE WHEN g <= $expired
                       THEN now() - interval '30 days' - (($expired - g) || ' ms')::interval - interval '1 min'
                       ELSE now() - interval '30 days' + ((g - $expired) * (interval '30 days' / ($rows - $expired + 1)))
                     END AS t) tt;
SELECT setval('$schema.history_id_seq', $rows);
$fill_instances
SET session_replication_role = origin;
$(cat "$work/indexes.sql")
VACUUM ANALYZE $schema.history;
VACUUM ANALYZE $schema.history_instance;
SQL
echo "filled in $(( $(date +%s) - start )) s; history + indexes: $(psql "$url" -Atc "SELECT pg_size_pretty(pg_total_relation_size('$schema.history'))"), history_instance + indexes: $(psql "$url" -Atc "SELECT pg_size_pretty(pg_total_relation_size('$schema.history_instance'))")"

# The janitor's statement (pg_history.rs `purge`), as a prepared statement would run it.
purge_sql="DELETE FROM $schema.history WHERE id IN
  (SELECT id FROM $schema.history WHERE endpoint = \$1 AND at < \$2 ORDER BY at LIMIT \$3)"
echo "one batch's plan (rolled back):"
psql "$url" -q <<SQL | sed 's/^/  /'
BEGIN;
PREPARE purge(text, timestamptz, bigint) AS $purge_sql;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE purge('orders', now() - interval '30 days', 1000);
ROLLBACK;
SQL

cat > "$work/insert.sql" <<SQL
\set cart random(1, 10000000)
BEGIN;
INSERT INTO $schema.history (endpoint, kind, at, message_id, message_type, conversation_id, causation_id,
                             attempt, enqueued_at, received_at, detail$insert_columns)
VALUES ('orders', 'handled', now(), $schema.v7(clock_timestamp(), :cart), 'shop.PaymentReceived',
        $schema.v7(now() - interval '1 s', :cart), $schema.v7(now() - interval '10 ms', :cart), 1,
        now() - interval '20 ms', now() - interval '5 ms',
        jsonb_build_object('sagas', jsonb_build_array(jsonb_build_object('saga_type', 'shop.Checkout',
          'correlation', 'cart-' || :cart, 'before', '{"cart":"cart-' || :cart || '","paid":false,"note":"' || repeat('n', 100) || '"}',
          'after', '{"cart":"cart-' || :cart || '","paid":true,"note":"' || repeat('n', 100) || '"}')))$insert_values);
$insert_instance
END;
SQL
insert_latency() {
  pgbench "$url" -n -c 8 -j 2 -T "$1" -f "$work/insert.sql" 2>&1 |
    sed -n 's/^latency average = \(.*\)$/\1/p; s/^tps = \([0-9.]*\).*/\1 events\/s/p' | paste -sd' '
}
echo "inserts alone (8 clients, 15 s): $(insert_latency 15)"

# The purge in one session: each batch a transaction of its own (COMMIT in the
# procedure), timed by the server; the batches run until one deletes fewer than 1,000.
psql "$url" -q -v ON_ERROR_STOP=1 <<SQL
CREATE TABLE $schema.purge_log (batch int, started timestamptz, ms double precision, deleted bigint);
CREATE PROCEDURE $schema.purge_all(cutoff timestamptz) LANGUAGE plpgsql AS \$\$
DECLARE n bigint; b int := 0; t0 timestamptz;
BEGIN
  LOOP
    t0 := clock_timestamp();
    DELETE FROM $schema.history WHERE id IN
      (SELECT id FROM $schema.history WHERE endpoint = 'orders' AND at < cutoff ORDER BY at LIMIT 1000);
    GET DIAGNOSTICS n = ROW_COUNT;
    b := b + 1;
    INSERT INTO $schema.purge_log VALUES (b, t0, extract(epoch FROM clock_timestamp() - t0) * 1000, n);
    COMMIT;
    EXIT WHEN n < 1000;
  END LOOP;
END \$\$;
SQL
cutoff=$(psql "$url" -Atc "SELECT now() - interval '30 days'")
psql "$url" -q -c "CALL $schema.purge_all('$cutoff')" &
purger=$!
sleep 1
during_start=$(psql "$url" -Atc "SELECT clock_timestamp()")
echo "inserts during the purge (8 clients, 15 s): $(insert_latency 15)"
during_end=$(psql "$url" -Atc "SELECT clock_timestamp()")
wait $purger
psql "$url" -At <<SQL
SELECT format('purged %s events (and their instance rows) in %s batches, %s s: per batch mean %s ms, p50 %s, p99 %s, max %s',
  sum(deleted), count(*), round((sum(ms) / 1000)::numeric, 1), round(avg(ms)::numeric, 1),
  round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 1),
  round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 1), round(max(ms)::numeric, 1))
FROM $schema.purge_log;
SELECT format('  while the inserts ran: %s batches, mean %s ms; alone: %s batches, mean %s ms; first 100 batches mean %s ms, last 100 %s ms',
  count(*) FILTER (WHERE started BETWEEN '$during_start' AND '$during_end'),
  round((avg(ms) FILTER (WHERE started BETWEEN '$during_start' AND '$during_end'))::numeric, 1),
  count(*) FILTER (WHERE started NOT BETWEEN '$during_start' AND '$during_end'),
  round((avg(ms) FILTER (WHERE started NOT BETWEEN '$during_start' AND '$during_end'))::numeric, 1),
  round((avg(ms) FILTER (WHERE batch <= 100))::numeric, 1),
  round((avg(ms) FILTER (WHERE batch > (SELECT max(batch) - 100 FROM $schema.purge_log)))::numeric, 1))
FROM $schema.purge_log;
SELECT format('left: %s events past the retention, %s instance rows without their event',
  (SELECT count(*) FROM $schema.history WHERE at < '$cutoff'),
  (SELECT count(*) FROM $schema.history_instance i WHERE NOT EXISTS (SELECT 1 FROM $schema.history h WHERE h.id = i.history_id)));
SQL

[ "$sqlite_rows" -gt 0 ] || exit 0
# SQLite (the embedded broker's file, SqliteStore): the same shape at SQLITE_ROWS events,
# a tenth past the retention; sqlite_history.rs `purge`'s two statements, a transaction
# per batch of 1,000.
sqlite_expired=$((sqlite_rows / 10))
echo "SQLite: $sqlite_rows events ($sqlite_expired past the retention), $(sqlite3 --version | cut -d' ' -f1)"
sqlite_migrations=$(for f in $migrations; do
  f="$here/migrations/sqlite/$(basename "$f")"
  if [ -f "$f" ]; then echo "$f"; fi
done)
python3 - "$work/history.db" "$sqlite_rows" "$sqlite_expired" $sqlite_migrations <<'PY'
import sqlite3, sys, time, os
path, rows, expired, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode = WAL"); db.execute("PRAGMA synchronous = NORMAL"); db.execute("PRAGMA foreign_keys = ON")
for f in files:
    if os.path.exists(f):
        db.executescript(open(f).read())
day = 86400 * 10**6
now = int(time.time() * 10**6)
cut = now - 30 * day
t0 = time.time()
db.execute("BEGIN")
db.execute(f"""WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
  INSERT INTO courier_history (id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id,
                               attempt, enqueued_at, received_at, detail)
  SELECT n, 'orders', 'handled',
         CASE WHEN n <= {expired} THEN {cut} - 60000000 - ({expired} - n) * 1000
              ELSE {cut} + (n - {expired}) * ({30 * day} / ({rows - expired} + 1)) END,
         printf('%012x-7', n) || hex(randomblob(10)), 'shop.PaymentReceived', printf('%012x-7', n - n % 5) || 'c',
         printf('%012x-7', n - 1) || 'm', 1, NULL, NULL,
         CASE WHEN n % 10 < 6 THEN '{{"sagas":[{{"saga_type":"shop.Checkout","correlation":"cart-' || (n / 3) ||
              '","before":"{{\\"paid\\":false,\\"note\\":\\"' || replace(hex(zeroblob(50)), '0', 'n') || '\\"}}","after":"{{\\"paid\\":true}}"}}]}}'
              ELSE '{{"sent":[{{"message_id":"' || hex(randomblob(16)) || '","destination":"shipping"}}]}}' END
  FROM g""")
db.execute(f"""WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
  INSERT INTO courier_history_instance (history_id, saga_type, correlation)
  SELECT n, 'shop.Checkout', 'cart-' || (n / 3) FROM g WHERE n % 10 < 6""")
db.execute("COMMIT")
db.execute("ANALYZE")
print(f"  filled in {time.time() - t0:.0f} s, {os.path.getsize(path) / 2**20:.0f} MiB")
for sql in ["DELETE FROM courier_history_instance WHERE history_id IN (SELECT id FROM courier_history WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)",
            "DELETE FROM courier_history WHERE id IN (SELECT id FROM courier_history WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)"]:
    plan = db.execute("EXPLAIN QUERY PLAN " + sql, ("orders", cut, 1000)).fetchall()
    print("  plan: " + sql.split(" WHERE")[0] + ": " + "; ".join(r[3] for r in plan))
times = []
total = 0
while True:
    t = time.perf_counter()
    db.execute("BEGIN IMMEDIATE")
    db.execute("DELETE FROM courier_history_instance WHERE history_id IN (SELECT id FROM courier_history WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)", ("orders", cut, 1000))
    n = db.execute("DELETE FROM courier_history WHERE id IN (SELECT id FROM courier_history WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)", ("orders", cut, 1000)).rowcount
    db.execute("COMMIT")
    times.append((time.perf_counter() - t) * 1000)
    total += n
    if n < 1000:
        break
times.sort()
print(f"  purged {total} events in {len(times)} batches, {sum(times) / 1000:.1f} s: per batch mean {sum(times) / len(times):.1f} ms, "
      f"p50 {times[len(times) // 2]:.1f}, p99 {times[int((len(times) - 1) * 0.99)]:.1f}, max {times[-1]:.1f}")
left = db.execute("SELECT count(*) FROM courier_history_instance i WHERE NOT EXISTS (SELECT 1 FROM courier_history h WHERE h.id = i.history_id)").fetchone()[0]
print(f"  left: {db.execute('SELECT count(*) FROM courier_history WHERE at < ?', (cut,)).fetchone()[0]} events past the retention, {left} instance rows without their event")
PY
