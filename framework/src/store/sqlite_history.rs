//! The history's SQLite statements (`courier_history`, `courier_history_instance`), on a
//! connection: the SQLite store and the embedded broker's store run them in a handling's
//! transaction (a handled event) or on their own (the others, and the janitor's purge).

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;

use crate::error::Result;
use crate::store::db_error;
use crate::store::history::HistoryEvent;

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// The columns of an event's row, bound in this order.
const EVENT_COLUMNS: &str = "endpoint, kind, at, message_id, message_type, conversation_id, causation_id, \
     attempt, enqueued_at, received_at, detail";

/// The parameters of an event's row, and two per saga instance it touched.
const EVENT_PARAMETERS: usize = 11;

/// The most parameters one query binds: SQLite's default bound on a statement's
/// (`SQLITE_MAX_VARIABLE_NUMBER`, 32,766 since 3.32), which a query of several statements
/// stays under too; it also keeps the query's text far below SQLite's 1 MB bound.
const MAX_PARAMETERS: usize = 30_000;

/// Appends to `sql` the statements of one event: the event's row, then its instance rows,
/// whose event is the row just inserted (`last_insert_rowid()`, which an insert into
/// `courier_history_instance`, a table WITHOUT ROWID, leaves as it is). Anonymous `?`
/// placeholders: sqlx binds them in order across the query's statements, where a
/// numbered `?N` in a later statement would be bound from the wrong place.
fn push_statements(sql: &mut String, instances: usize) {
    use std::fmt::Write as _;
    let _ = write!(
        sql,
        "INSERT INTO courier_history ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);"
    );
    if instances > 0 {
        let rows = vec!["(last_insert_rowid(), ?, ?)"; instances];
        let _ = write!(
            sql,
            " INSERT INTO courier_history_instance (history_id, saga_type, correlation) VALUES {};",
            rows.join(", ")
        );
    }
}

/// An event ready to be written: its detail rendered (the one step that can fail before
/// the statement) and the saga instances it touched.
pub(crate) struct Rendered {
    event: HistoryEvent,
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
            event: event.clone(),
        })
    }
}

/// Writes `event` and the saga instances it touched, in one query (one trip to the
/// connection's thread).
pub(crate) async fn record(conn: &mut SqliteConnection, event: &HistoryEvent) -> Result<()> {
    record_then(conn, &[Rendered::new(event)?], None)
        .await
        .map_err(|e| db_error("cannot record the history of a message", e))
}

/// Writes `events` (with the saga instances each touched) and then runs `then` (a
/// transaction's `COMMIT`), in as few queries as SQLite's bound on parameters allows:
/// one trip to the connection's thread for a handling, whose event took a trip of its
/// own before. A failing statement stops its query: `then` does not run.
pub(crate) async fn record_then(
    conn: &mut SqliteConnection,
    events: &[Rendered],
    then: Option<&str>,
) -> std::result::Result<(), sqlx::Error> {
    let mut rest = events.iter().peekable();
    loop {
        let mut sql = String::new();
        let mut chunk = Vec::new();
        let mut bound = 0;
        while let Some(r) = rest.peek() {
            let needs = EVENT_PARAMETERS + 2 * r.instances.len();
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
            return Ok(());
        }
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for r in chunk {
            let event = &r.event;
            query = query
                .bind(&event.endpoint)
                .bind(event.kind.as_str())
                .bind(micros(event.at))
                .bind(&event.message_id)
                .bind(&event.message_type)
                .bind(&event.conversation_id)
                .bind(&event.causation_id)
                .bind(i64::from(event.attempt))
                .bind(event.enqueued_at.map(micros))
                .bind(event.received_at.map(micros))
                .bind(&r.detail);
            for (saga_type, correlation) in &r.instances {
                query = query.bind(saga_type).bind(correlation);
            }
        }
        query.execute(&mut *conn).await?;
        if last {
            return Ok(());
        }
    }
}

/// Deletes up to `limit` of `endpoint`'s events older than `before`, oldest first, with
/// their instance rows; how many events.
pub(crate) async fn purge(
    conn: &mut SqliteConnection,
    endpoint: &str,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    sqlx::query(
        "DELETE FROM courier_history_instance WHERE history_id IN \
         (SELECT id FROM courier_history WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)",
    )
    .bind(endpoint)
    .bind(micros(before))
    .bind(limit)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot purge the history", e))?;
    let done = sqlx::query(
        "DELETE FROM courier_history WHERE id IN \
         (SELECT id FROM courier_history WHERE endpoint = ?1 AND at < ?2 ORDER BY at LIMIT ?3)",
    )
    .bind(endpoint)
    .bind(micros(before))
    .bind(limit)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot purge the history", e))?;
    Ok(done.rows_affected())
}
