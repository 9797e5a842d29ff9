//! The history's queries in SQLite (`courier_history_all`, the indexed `courier_history`
//! and the recent events not moved there yet as one, and `courier_history_instance_all`,
//! their saga instances likewise; see `store::sqlite_history`):
//! [`HistoryAdmin`] for the SQLite store ([`SqliteAdmin`]) and the embedded broker's file
//! ([`EmbeddedAdmin`]), whose tables are the same. Times are microseconds since the epoch;
//! lists of ids go to SQLite as one JSON array (`json_each`).
//!
//! SQLite stores what it is given: each column is read on its own and leniently (text as
//! bytes, shown with `\xNN` where it is not UTF-8), so an odd row is listed with what
//! could be read and its problems said.

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqlitePool};

use super::history::{FoundHistory, HistoryAdmin, HistoryFilter, MessageHistory, SagaHistory};
use super::history_read::{
    HistoryRows, INSTANCE_MESSAGES, Needles, RawRow, find, message_history, saga_history, sql_limit, time_of_micros,
};
use super::model::shown_bytes;
use super::sqlite::micros;
use super::{AdminError, AdminResult, EmbeddedAdmin, SqliteAdmin};

/// The columns of an event, in [`raw`]'s order.
const COLUMNS: &str = "h.id, h.endpoint, h.kind, h.at, h.message_id, h.message_type, h.conversation_id, \
     h.causation_id, h.attempt, h.enqueued_at, h.received_at, h.detail";

/// The filter's times and outcomes, on parameters ?1 (since), ?2 (until), ?3 (the
/// outcomes as a JSON array, or NULL for all).
const FILTER: &str = "(?1 IS NULL OR h.at >= ?1) AND (?2 IS NULL OR h.at <= ?2) \
     AND (?3 IS NULL OR h.kind IN (SELECT value FROM json_each(?3)))";

/// The queries on a pool of the file.
pub(crate) struct SqliteRows<'a>(pub(crate) &'a SqlitePool);

fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

/// A text column as it may be shown, or `None` with a problem said when it cannot be
/// read at all.
fn text(row: &SqliteRow, i: usize, column: &str, problems: &mut Vec<String>) -> Option<String> {
    match row.try_get::<Option<Vec<u8>>, _>(i) {
        Ok(raw) => raw.map(|raw| {
            if std::str::from_utf8(&raw).is_err() {
                problems.push(format!(
                    "its {column} is not UTF-8: shown with \\xNN for the other bytes"
                ));
            }
            shown_bytes(&raw)
        }),
        Err(e) => {
            problems.push(format!("its {column} cannot be read ({e}); not shown"));
            None
        }
    }
}

fn integer(row: &SqliteRow, i: usize, column: &str, problems: &mut Vec<String>) -> Option<i64> {
    match row.try_get::<Option<i64>, _>(i) {
        Ok(v) => v,
        Err(e) => {
            problems.push(format!("its {column} cannot be read ({e}); not shown"));
            None
        }
    }
}

/// A row of [`COLUMNS`].
fn raw(row: &SqliteRow) -> AdminResult<RawRow> {
    let id: i64 = row
        .try_get(0)
        .map_err(|e| AdminError::db("cannot read a row of the history", e))?;
    let mut p = Vec::new();
    let time = |i: usize, column: &str, p: &mut Vec<String>| {
        integer(row, i, column, p).and_then(|v| time_of_micros(v, column, p))
    };
    let at = time(3, "time", &mut p);
    let enqueued_at = time(9, "enqueue time", &mut p);
    let received_at = time(10, "receive time", &mut p);
    Ok(RawRow {
        id,
        endpoint: text(row, 1, "endpoint", &mut p).unwrap_or_default(),
        kind: text(row, 2, "outcome", &mut p).unwrap_or_default(),
        at,
        message_id: text(row, 4, "message id", &mut p).unwrap_or_default(),
        message_type: text(row, 5, "message type", &mut p),
        conversation_id: text(row, 6, "conversation id", &mut p),
        causation_id: text(row, 7, "causation id", &mut p),
        attempt: integer(row, 8, "attempt", &mut p),
        enqueued_at,
        received_at,
        detail: text(row, 11, "detail", &mut p),
        problems: p,
    })
}

fn raws(rows: &[SqliteRow]) -> AdminResult<Vec<RawRow>> {
    rows.iter().map(raw).collect()
}

#[async_trait]
impl HistoryRows for SqliteRows<'_> {
    async fn instance_messages(
        &self,
        saga_type: &str,
        correlation: &str,
    ) -> AdminResult<Vec<(String, String, Option<String>)>> {
        let rows = sqlx::query(
            "SELECT DISTINCT h.message_id, h.endpoint, h.conversation_id FROM courier_history_instance_all i \
             JOIN courier_history_all h ON h.id = i.history_id WHERE i.saga_type = ?1 AND i.correlation = ?2 LIMIT ?3",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(INSTANCE_MESSAGES)
        .fetch_all(self.0)
        .await
        .map_err(|e| AdminError::db("cannot read the history of a saga instance", e))?;
        Ok(rows
            .iter()
            .map(|r| {
                let mut ignored = Vec::new();
                (
                    text(r, 0, "message id", &mut ignored).unwrap_or_default(),
                    text(r, 1, "endpoint", &mut ignored).unwrap_or_default(),
                    text(r, 2, "conversation id", &mut ignored),
                )
            })
            .collect())
    }

    async fn instance_events(
        &self,
        saga_type: &str,
        correlation: &str,
        filter: &HistoryFilter,
        limit: usize,
    ) -> AdminResult<Vec<RawRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM courier_history_instance_all i JOIN courier_history_all h ON h.id = i.history_id \
             WHERE i.saga_type = ?4 AND i.correlation = ?5 AND {FILTER} ORDER BY h.at, h.id LIMIT ?6"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.since.map(micros))
            .bind(filter.until.map(micros))
            .bind(filter.kinds().map(|k| json_list(&k)))
            .bind(saga_type)
            .bind(correlation)
            .bind(sql_limit(limit))
            .fetch_all(self.0)
            .await
            .map_err(|e| AdminError::db("cannot read the history of a saga instance", e))?;
        raws(&rows)
    }

    async fn related_failures(
        &self,
        ids: &[String],
        conversations: &[String],
        endpoints: &[String],
        kinds: &[&'static str],
        filter: &HistoryFilter,
        limit: usize,
    ) -> AdminResult<Vec<RawRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM courier_history_all h WHERE h.id IN \
             (SELECT id FROM courier_history_all WHERE message_id IN (SELECT value FROM json_each(?4)) \
              UNION SELECT id FROM courier_history_all c WHERE c.conversation_id IN (SELECT value FROM json_each(?5)) \
              AND c.kind <> 'handled' AND NOT EXISTS (SELECT 1 FROM courier_history_all o \
              WHERE o.message_id = c.message_id AND o.endpoint = c.endpoint AND o.kind = 'handled')) \
             AND h.endpoint IN (SELECT value FROM json_each(?6)) AND {FILTER} \
             ORDER BY h.at, h.id LIMIT ?7"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.since.map(micros))
            .bind(filter.until.map(micros))
            .bind(json_list(kinds))
            .bind(json_list(ids))
            .bind(json_list(conversations))
            .bind(json_list(endpoints))
            .bind(sql_limit(limit))
            .fetch_all(self.0)
            .await
            .map_err(|e| AdminError::db("cannot read the failed attempts of a saga instance", e))?;
        raws(&rows)
    }

    async fn of_message(&self, id: &str, limit: usize) -> AdminResult<Vec<RawRow>> {
        let sql =
            format!("SELECT {COLUMNS} FROM courier_history_all h WHERE h.message_id = ?1 ORDER BY h.at, h.id LIMIT ?2");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(sql_limit(limit))
            .fetch_all(self.0)
            .await
            .map_err(|e| AdminError::db("cannot read the history of a message", e))?;
        raws(&rows)
    }

    async fn caused_by(&self, ids: &[String], limit: usize) -> AdminResult<Vec<RawRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM courier_history_all h WHERE h.causation_id IN (SELECT value FROM json_each(?1)) \
             ORDER BY h.at, h.id LIMIT ?2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(json_list(ids))
            .bind(sql_limit(limit))
            .fetch_all(self.0)
            .await
            .map_err(|e| AdminError::db("cannot read the messages a message caused", e))?;
        raws(&rows)
    }

    async fn containing(&self, needles: &Needles, filter: &HistoryFilter, limit: usize) -> AdminResult<Vec<RawRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM courier_history_all h WHERE {FILTER} AND (h.message_id = ?4 OR h.conversation_id = ?4 \
             OR h.causation_id = ?4 OR instr(h.detail, ?4) > 0 OR instr(h.detail, ?5) > 0 \
             OR instr(h.detail, ?6) > 0) ORDER BY h.at DESC, h.id DESC LIMIT ?7"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.since.map(micros))
            .bind(filter.until.map(micros))
            .bind(filter.kinds().map(|k| json_list(&k)))
            .bind(&needles.text)
            .bind(&needles.escaped)
            .bind(&needles.twice)
            .bind(sql_limit(limit))
            .fetch_all(self.0)
            .await
            .map_err(|e| AdminError::db("cannot search the history", e))?;
        raws(&rows)
    }
}

#[async_trait]
impl HistoryAdmin for SqliteAdmin {
    fn describe(&self) -> String {
        super::StoreAdmin::describe(self)
    }

    async fn saga_history(
        &self,
        saga_type: &str,
        correlation: &str,
        filter: &HistoryFilter,
    ) -> AdminResult<SagaHistory> {
        saga_history(&SqliteRows(&self.pool), saga_type, correlation, filter).await
    }

    async fn message_history(&self, message_id: &str, filter: &HistoryFilter) -> AdminResult<MessageHistory> {
        message_history(&SqliteRows(&self.pool), message_id, filter).await
    }

    async fn find(&self, text: &str, filter: &HistoryFilter) -> AdminResult<FoundHistory> {
        find(&SqliteRows(&self.pool), text, filter).await
    }
}

#[async_trait]
impl HistoryAdmin for EmbeddedAdmin {
    fn describe(&self) -> String {
        super::StoreAdmin::describe(self)
    }

    async fn saga_history(
        &self,
        saga_type: &str,
        correlation: &str,
        filter: &HistoryFilter,
    ) -> AdminResult<SagaHistory> {
        saga_history(&SqliteRows(&self.pool), saga_type, correlation, filter).await
    }

    async fn message_history(&self, message_id: &str, filter: &HistoryFilter) -> AdminResult<MessageHistory> {
        message_history(&SqliteRows(&self.pool), message_id, filter).await
    }

    async fn find(&self, text: &str, filter: &HistoryFilter) -> AdminResult<FoundHistory> {
        find(&SqliteRows(&self.pool), text, filter).await
    }
}
