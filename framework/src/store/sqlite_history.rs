//! The history's SQLite statements (`courier_history`, `courier_history_recent`,
//! `courier_history_instance`), on a connection: the SQLite store and the embedded broker's
//! store run them in a handling's transaction (a handled event) or on their own (the
//! others, the move of the recent events, and the janitor's purge).
//!
//! An event goes to `courier_history_recent`, which has no index but its row id, with the
//! first saga instance it names in its row and the others in
//! `courier_history_instance_recent`, so that a handling's commit writes a page or two
//! more instead of one per index (migrations `20261206000001_history_recent` and
//! `20261209000001_history_recent_lighter`). Every [`MOVE_EVERY`] ids, the writer that crossed the
//! mark moves the recent rows into `courier_history` and `courier_history_instance` (ids
//! kept), in a transaction of its own after its commit ([`move_recent`]). Readers read
//! `courier_history_all` and `courier_history_instance_all`, both tables of each as one.

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;

use crate::error::Result;
use crate::store::db_error;
use crate::store::history::HistoryEvent;

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// The columns of an event's row in `courier_history_recent`, bound in this order: the last
/// two are its first saga instance (two NULLs when it touched none).
const EVENT_COLUMNS: &str = "endpoint, kind, at, message_id, message_type, conversation_id, causation_id, \
     attempt, enqueued_at, received_at, detail, saga_type, correlation";

/// The parameters of an event's row (its first saga instance, or two NULLs, among them),
/// and two per other saga instance it touched.
const EVENT_PARAMETERS: usize = 13;

/// The most parameters one query binds: SQLite's default bound on a statement's
/// (`SQLITE_MAX_VARIABLE_NUMBER`, 32,766 since 3.32), which a query of several statements
/// stays under too; it also keeps the query's text far below SQLite's 1 MB bound.
const MAX_PARAMETERS: usize = 30_000;

/// An event's id: one more than the largest below 2^62 of either table, so that the two
/// tables share one sequence and a moved row keeps its id. Each is the largest row id of
/// its table below the bound, which SQLite finds by one seek from the end of the table's
/// tree. Ids from 2^62 up (only another writer's: Courier's own sequence would take
/// centuries to get there) are left out, so a row with the largest id SQLite allows
/// cannot make the sum overflow (SQLite turns it into a real number, which no id column
/// takes: every handling would fail). Should the sequence reach 2^62 anyway, the id is
/// NULL, and SQLite gives the row one itself: one more than the recent table's largest,
/// or, when that is the largest SQLite allows, an unused one at random. A row that
/// collides with one of `courier_history` is given a new id when it is moved.
const NEXT_ID: &str = "nullif(1 + max( \
     coalesce((SELECT max(id) FROM courier_history WHERE id < 4611686018427387904), 0), \
     coalesce((SELECT max(id) FROM courier_history_recent WHERE id < 4611686018427387904), 0)), \
     4611686018427387904)";

/// The recent events whose id another writer gave a row of `courier_history` meanwhile
/// (an insert without an id there takes one more than that table's largest, which the
/// recent table may hold already).
const TAKEN: &str = "SELECT r.id FROM courier_history_recent r \
     WHERE EXISTS (SELECT 1 FROM courier_history h WHERE h.id = r.id) ORDER BY r.id";

/// A random id neither event table holds (for a recent event whose id was taken, once
/// the sequence passed 2^62), or no row when the one drawn is held.
const RANDOM_FREE_ID: &str = "SELECT candidate FROM (SELECT random() & 9223372036854775807 AS candidate) \
     WHERE NOT EXISTS (SELECT 1 FROM courier_history WHERE id = candidate) \
     AND NOT EXISTS (SELECT 1 FROM courier_history_recent WHERE id = candidate)";

/// How many random ids [`free_id`] draws before it gives up (each is held with a chance
/// of the tables' rows in 2^63).
const RANDOM_DRAWS: usize = 64;

/// How many ids apart the moves of the recent events are: a handling writes its event to
/// an unindexed table, and the indexes of `courier_history` take a few hundred rows at
/// once, in a few pages, instead of a page each per handling.
pub(crate) const MOVE_EVERY: i64 = 512;

/// The statements that move the recent events into `courier_history`, their ids kept, in
/// the transaction [`move_recent`] began: first the recent instance rows whose event is in
/// neither recent table are deleted (only another writer leaves such a row, which no read
/// shows, as every read joins an instance row to its event), then both tables' rows are
/// copied and deleted, each event's first instance (in its row) into
/// `courier_history_instance` with the others. An instance row `courier_history_instance`
/// holds already (another writer put the same instance in the event's row and in the
/// recent instance table) is there once: the copy is not inserted again.
const MOVE: &str = "DELETE FROM courier_history_instance_recent WHERE NOT EXISTS \
       (SELECT 1 FROM courier_history_recent r WHERE r.id = history_id); \
     INSERT INTO courier_history (id, endpoint, kind, at, message_id, message_type, conversation_id, \
       causation_id, attempt, enqueued_at, received_at, detail) \
     SELECT id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt, \
       enqueued_at, received_at, detail FROM courier_history_recent ORDER BY id; \
     INSERT OR IGNORE INTO courier_history_instance (history_id, saga_type, correlation) \
     SELECT history_id, saga_type, correlation FROM courier_history_instance_recent \
     UNION ALL SELECT id, saga_type, correlation FROM courier_history_recent WHERE saga_type IS NOT NULL; \
     DELETE FROM courier_history_instance_recent; \
     DELETE FROM courier_history_recent; \
     COMMIT;";

/// Appends to `sql` the statements of one event: the event's row in
/// `courier_history_recent` with its first saga instance (or two NULLs), then its other
/// instance rows in `courier_history_instance_recent`, whose event is the row just
/// inserted (`last_insert_rowid()`, which an insert into a table WITHOUT ROWID leaves as it
/// is). Anonymous `?` placeholders: sqlx binds them in order across the query's
/// statements, where a numbered `?N` in a later statement would be bound from the wrong
/// place.
fn push_statements(sql: &mut String, instances: usize) {
    use std::fmt::Write as _;
    let _ = write!(
        sql,
        "INSERT INTO courier_history_recent (id, {EVENT_COLUMNS}) \
         VALUES ({NEXT_ID}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);"
    );
    if instances > 1 {
        let rows = vec!["(last_insert_rowid(), ?, ?)"; instances - 1];
        let _ = write!(
            sql,
            " INSERT INTO courier_history_instance_recent (history_id, saga_type, correlation) VALUES {};",
            rows.join(", ")
        );
    }
}

/// An event ready to be written: its row's values, its detail rendered (the one step
/// that can fail before the statement) and the saga instances it touched. The event
/// itself is not kept: its detail (the states before and after, the messages sent) is
/// in `detail` already, and a copy of it would be made and freed in the writer's turn.
pub(crate) struct Rendered {
    endpoint: String,
    kind: &'static str,
    at: i64,
    message_id: String,
    message_type: Option<String>,
    conversation_id: Option<String>,
    causation_id: Option<String>,
    attempt: i64,
    enqueued_at: Option<i64>,
    received_at: Option<i64>,
    detail: String,
    instances: Vec<(String, String)>,
}

impl Rendered {
    /// Renders `event`'s detail; an error when it cannot be (nothing is written then).
    pub(crate) fn new(event: &HistoryEvent) -> Result<Self> {
        Ok(Self {
            detail: super::history::detail_json(event)?,
            instances: event
                .instances()
                .into_iter()
                .map(|(t, c)| (t.to_owned(), c.to_owned()))
                .collect(),
            endpoint: event.endpoint.clone(),
            kind: event.kind.as_str(),
            at: micros(event.at),
            message_id: event.message_id.clone(),
            message_type: event.message_type.clone(),
            conversation_id: event.conversation_id.clone(),
            causation_id: event.causation_id.clone(),
            attempt: i64::from(event.attempt),
            enqueued_at: event.enqueued_at.map(micros),
            received_at: event.received_at.map(micros),
        })
    }
}

/// Writes `event` and the saga instances it touched, in one query (one trip to the
/// connection's thread); whether the recent events are due to move (the caller runs
/// [`move_recent`] once its transaction committed).
pub(crate) async fn record(conn: &mut SqliteConnection, event: &HistoryEvent) -> Result<bool> {
    record_then(conn, vec![Rendered::new(event)?], None)
        .await
        .map_err(|e| db_error("cannot record the history of a message", e))
}

/// Whether the ids of `events` events written last, the last of them `last_id`, crossed a
/// multiple of [`MOVE_EVERY`]: the ids of one query are consecutive (its transaction is the
/// file's only writer), so each multiple is crossed by exactly one writer.
fn crossed(last_id: i64, events: usize) -> bool {
    events > 0 && last_id.rem_euclid(MOVE_EVERY) < i64::try_from(events).unwrap_or(i64::MAX)
}

/// Moves the recent events into `courier_history`, in a transaction of its own on `conn`
/// (which must be in none). A recent event whose id another writer gave a row of
/// `courier_history` meanwhile is first given a free id (its instance rows follow), so
/// that no value another writer may insert stops the moves. A failure is logged and
/// rolled back: the events stay readable in `courier_history_recent`, and the next writer
/// to cross a mark tries again.
pub(crate) async fn move_recent(conn: &mut SqliteConnection) {
    match try_move(conn).await {
        Ok(0) => {}
        Ok(renumbered) => tracing::info!(
            renumbered,
            "recent history events had ids that rows inserted into courier_history by another writer took; \
             they were given new ids when moved (Courier writes courier_history itself: insert nothing there)"
        ),
        Err(e) => {
            if let Err(rollback) = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await {
                tracing::debug!(error = %rollback, "no transaction to roll back after a failed move of the history");
            }
            tracing::warn!(
                error = %e,
                "cannot move the history's recent events into courier_history; they stay readable where they are \
                 and the move is tried again after {MOVE_EVERY} more events (check the file's free space and health)"
            );
        }
    }
}

/// [`move_recent`]'s transaction; how many recent events were given new ids.
async fn try_move(conn: &mut SqliteConnection) -> std::result::Result<usize, sqlx::Error> {
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let taken: Vec<i64> = sqlx::query_scalar(TAKEN).fetch_all(&mut *conn).await?;
    for &old in &taken {
        let new = free_id(conn).await?;
        sqlx::query("UPDATE courier_history_instance_recent SET history_id = ?1 WHERE history_id = ?2")
            .bind(new)
            .bind(old)
            .execute(&mut *conn)
            .await?;
        sqlx::query("UPDATE courier_history_recent SET id = ?1 WHERE id = ?2")
            .bind(new)
            .bind(old)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::raw_sql(MOVE).execute(&mut *conn).await?;
    Ok(taken.len())
}

/// An id neither event table holds: the next of the sequence ([`NEXT_ID`]), or past 2^62
/// one drawn at random; an error when [`RANDOM_DRAWS`] draws were all held.
async fn free_id(conn: &mut SqliteConnection) -> std::result::Result<i64, sqlx::Error> {
    let next: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {NEXT_ID}")))
        .fetch_one(&mut *conn)
        .await?;
    if let Some(id) = next {
        return Ok(id);
    }
    for _ in 0..RANDOM_DRAWS {
        if let Some(id) = sqlx::query_scalar(RANDOM_FREE_ID).fetch_optional(&mut *conn).await? {
            return Ok(id);
        }
    }
    Err(sqlx::Error::Protocol(format!(
        "no free history id found in {RANDOM_DRAWS} random draws"
    )))
}

/// Writes `events` (with the saga instances each touched) and then runs `then` (a
/// transaction's `COMMIT`), in as few queries as SQLite's bound on parameters allows:
/// one trip to the connection's thread for a handling, whose event took a trip of its
/// own before. A failing statement stops its query: `then` does not run. Returns whether
/// the events crossed a mark of [`MOVE_EVERY`]: the caller then runs [`move_recent`] once
/// `then` committed.
pub(crate) async fn record_then(
    conn: &mut SqliteConnection,
    events: Vec<Rendered>,
    then: Option<&str>,
) -> std::result::Result<bool, sqlx::Error> {
    let mut due = false;
    let mut rest = events.into_iter().peekable();
    loop {
        let mut sql = String::new();
        let mut chunk = Vec::new();
        let mut bound = 0;
        while let Some(r) = rest.peek() {
            let needs = EVENT_PARAMETERS + 2 * r.instances.len().saturating_sub(1);
            if !chunk.is_empty() && bound + needs > MAX_PARAMETERS {
                break;
            }
            push_statements(&mut sql, r.instances.len());
            bound += needs;
            chunk.extend(rest.next());
        }
        let last = rest.peek().is_none();
        if last && let Some(then) = then {
            sql.push(' ');
            sql.push_str(then);
        }
        if sql.is_empty() {
            return Ok(due);
        }
        let written = chunk.len();
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for r in chunk {
            // Bound by value: the values move into the query, where a reference would be
            // copied (the detail is most of an event's bytes).
            query = query
                .bind(r.endpoint)
                .bind(r.kind)
                .bind(r.at)
                .bind(r.message_id)
                .bind(r.message_type)
                .bind(r.conversation_id)
                .bind(r.causation_id)
                .bind(r.attempt)
                .bind(r.enqueued_at)
                .bind(r.received_at)
                .bind(r.detail);
            let mut instances = r.instances.into_iter();
            let (saga_type, correlation) = instances.next().unzip();
            query = query.bind(saga_type).bind(correlation);
            for (saga_type, correlation) in instances {
                query = query.bind(saga_type).bind(correlation);
            }
        }
        let done = query.execute(&mut *conn).await?;
        due |= crossed(done.last_insert_rowid(), written);
        if last {
            return Ok(due);
        }
    }
}

/// The purge's statements, in order: for each event table, its instance rows, then its
/// events; each on parameters `?1` (endpoint), `?2` (before) and `?3` (limit).
const PURGE: [&str; 4] = [
    "DELETE FROM courier_history_instance_recent WHERE history_id IN \
     (SELECT id FROM courier_history_recent WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)",
    "DELETE FROM courier_history_recent WHERE id IN \
     (SELECT id FROM courier_history_recent WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)",
    "DELETE FROM courier_history_instance WHERE history_id IN \
     (SELECT id FROM courier_history WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)",
    "DELETE FROM courier_history WHERE id IN \
     (SELECT id FROM courier_history WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)",
];

/// Deletes up to `limit` of `endpoint`'s events older than `before` from each table,
/// oldest first, with their instance rows; how many events. The recent table holds a few
/// hundred rows unless its moves failed, when this keeps it bounded too.
pub(crate) async fn purge(
    conn: &mut SqliteConnection,
    endpoint: &str,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    let mut events = 0;
    for (i, sql) in PURGE.into_iter().enumerate() {
        let done = sqlx::query(sql)
            .bind(endpoint)
            .bind(micros(before))
            .bind(limit)
            .execute(&mut *conn)
            .await
            .map_err(|e| db_error("cannot purge the history", e))?;
        // The second and the fourth delete events; the others, their instance rows.
        if i % 2 == 1 {
            events += done.rows_affected();
        }
    }
    Ok(events)
}
