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

/// The event's statement: its parameters are `?1` to `?11`.
const INSERT_EVENT: &str = "INSERT INTO courier_history (endpoint, kind, at, message_id, message_type, \
     conversation_id, causation_id, attempt, enqueued_at, received_at, detail) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

/// The statements of an event that touched `instances` saga instances: the event's, then
/// one for its instance rows, whose (type, correlation) are `?12`, `?13`, then `?14`,
/// `?15`, and so on, and whose event is the row just inserted (`last_insert_rowid()`,
/// which an insert into `courier_history_instance`, a table WITHOUT ROWID, leaves as it
/// is). Run as one query: one trip to the connection's thread, where two statements took
/// two.
fn insert_with_instances(instances: usize) -> String {
    let rows: Vec<String> = (0..instances)
        .map(|i| format!("(last_insert_rowid(), ?{}, ?{})", 12 + 2 * i, 13 + 2 * i))
        .collect();
    format!(
        "{INSERT_EVENT}; INSERT INTO courier_history_instance (history_id, saga_type, correlation) VALUES {}",
        rows.join(", ")
    )
}

/// Writes `event` and the saga instances it touched, in one query (one trip to the
/// connection's thread).
pub(crate) async fn record(conn: &mut SqliteConnection, event: &HistoryEvent) -> Result<()> {
    let detail = super::history::detail_json(event)?;
    let instances = event.instances();
    let sql = if instances.is_empty() {
        std::borrow::Cow::Borrowed(INSERT_EVENT)
    } else {
        std::borrow::Cow::Owned(insert_with_instances(instances.len()))
    };
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
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
        .bind(detail);
    for (saga_type, correlation) in instances {
        query = query.bind(saga_type).bind(correlation);
    }
    query
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot record the history of a message", e))?;
    Ok(())
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
