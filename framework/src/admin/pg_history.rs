//! The history's queries in Postgres (`courier.history`, and its saga instances through `courier.history_instance_all`):
//! [`HistoryAdmin`] for [`PostgresAdmin`], over the tables the Postgres store and the
//! Postgres transport's store write. Lists of ids go as `text[]`; the detail is read as
//! the text of its `jsonb`.
//!
//! Each column is read on its own, so a value that cannot be read (a column another
//! program changed the type of) is said in the event's problems, not a failure of the
//! listing.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::history::{FoundHistory, HistoryAdmin, HistoryFilter, MessageHistory, SagaHistory};
use super::history_read::{
    HistoryRows, INSTANCE_MESSAGES, Needles, RawRow, find, message_history, saga_history, sql_limit,
};
use super::{AdminError, AdminResult, PostgresAdmin};

/// The columns of an event, in [`raw`]'s order.
const COLUMNS: &str = "h.id, h.endpoint, h.kind, h.at, h.message_id, h.message_type, h.conversation_id, \
     h.causation_id, h.attempt::bigint, h.enqueued_at, h.received_at, h.detail::text";

/// The filter's times and outcomes, on parameters $1 (since), $2 (until), $3 (the
/// outcomes, or NULL for all).
const FILTER: &str = "($1::timestamptz IS NULL OR h.at >= $1) AND ($2::timestamptz IS NULL OR h.at <= $2) \
     AND ($3::text[] IS NULL OR h.kind = ANY($3))";

/// The queries on the admin's pool.
struct PgRows<'a>(&'a sqlx::PgPool);

/// Column `i`, or `None` with a problem said when it cannot be read.
fn get<'r, T>(row: &'r PgRow, i: usize, column: &str, problems: &mut Vec<String>) -> Option<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    match row.try_get::<Option<T>, _>(i) {
        Ok(v) => v,
        Err(e) => {
            problems.push(format!("its {column} cannot be read ({e}); not shown"));
            None
        }
    }
}

/// A row of [`COLUMNS`].
fn raw(row: &PgRow) -> AdminResult<RawRow> {
    let id: i64 = row
        .try_get(0)
        .map_err(|e| AdminError::db("cannot read a row of the history", e))?;
    let mut p = Vec::new();
    Ok(RawRow {
        id,
        endpoint: get(row, 1, "endpoint", &mut p).unwrap_or_default(),
        kind: get(row, 2, "outcome", &mut p).unwrap_or_default(),
        at: get::<DateTime<Utc>>(row, 3, "time", &mut p),
        message_id: get(row, 4, "message id", &mut p).unwrap_or_default(),
        message_type: get(row, 5, "message type", &mut p),
        conversation_id: get(row, 6, "conversation id", &mut p),
        causation_id: get(row, 7, "causation id", &mut p),
        attempt: get(row, 8, "attempt", &mut p),
        enqueued_at: get(row, 9, "enqueue time", &mut p),
        received_at: get(row, 10, "receive time", &mut p),
        detail: get(row, 11, "detail", &mut p),
        problems: p,
    })
}

fn raws(rows: &[PgRow]) -> AdminResult<Vec<RawRow>> {
    rows.iter().map(raw).collect()
}

#[async_trait]
impl HistoryRows for PgRows<'_> {
    async fn instance_messages(
        &self,
        saga_type: &str,
        correlation: &str,
    ) -> AdminResult<Vec<(String, String, Option<String>)>> {
        sqlx::query_as(
            "SELECT DISTINCT h.message_id, h.endpoint, h.conversation_id FROM courier.history_instance_all i \
             JOIN courier.history h ON h.id = i.history_id WHERE i.saga_type = $1 AND i.correlation = $2 LIMIT $3",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(INSTANCE_MESSAGES)
        .fetch_all(self.0)
        .await
        .map_err(|e| AdminError::db("cannot read the history of a saga instance", e))
    }

    async fn instance_events(
        &self,
        saga_type: &str,
        correlation: &str,
        filter: &HistoryFilter,
        limit: usize,
    ) -> AdminResult<Vec<RawRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM courier.history_instance_all i JOIN courier.history h ON h.id = i.history_id \
             WHERE i.saga_type = $4 AND i.correlation = $5 AND {FILTER} ORDER BY h.at, h.id LIMIT $6"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.since)
            .bind(filter.until)
            .bind(filter.kinds())
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
            "SELECT {COLUMNS} FROM courier.history h WHERE h.id IN \
             (SELECT id FROM courier.history WHERE message_id = ANY($4) \
              UNION SELECT id FROM courier.history c WHERE c.conversation_id = ANY($5) AND c.kind <> 'handled' \
              AND NOT EXISTS (SELECT 1 FROM courier.history o WHERE o.message_id = c.message_id \
              AND o.endpoint = c.endpoint AND o.kind = 'handled')) \
             AND h.endpoint = ANY($6) AND {FILTER} ORDER BY h.at, h.id LIMIT $7"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.since)
            .bind(filter.until)
            .bind(kinds)
            .bind(ids)
            .bind(conversations)
            .bind(endpoints)
            .bind(sql_limit(limit))
            .fetch_all(self.0)
            .await
            .map_err(|e| AdminError::db("cannot read the failed attempts of a saga instance", e))?;
        raws(&rows)
    }

    async fn of_message(&self, id: &str, limit: usize) -> AdminResult<Vec<RawRow>> {
        let sql =
            format!("SELECT {COLUMNS} FROM courier.history h WHERE h.message_id = $1 ORDER BY h.at, h.id LIMIT $2");
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
            "SELECT {COLUMNS} FROM courier.history h WHERE h.causation_id = ANY($1) ORDER BY h.at, h.id LIMIT $2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(ids)
            .bind(sql_limit(limit))
            .fetch_all(self.0)
            .await
            .map_err(|e| AdminError::db("cannot read the messages a message caused", e))?;
        raws(&rows)
    }

    async fn containing(&self, needles: &Needles, filter: &HistoryFilter, limit: usize) -> AdminResult<Vec<RawRow>> {
        // Searched as stored: Postgres's text holds no NUL, the writer wrote U+FFFD.
        let needles = &needles.as_postgres_stores();
        let sql = format!(
            "SELECT {COLUMNS} FROM courier.history h WHERE {FILTER} AND (h.message_id = $4 OR h.conversation_id = $4 \
             OR h.causation_id = $4 OR strpos(h.detail::text, $4) > 0 OR strpos(h.detail::text, $5) > 0 \
             OR strpos(h.detail::text, $6) > 0) ORDER BY h.at DESC, h.id DESC LIMIT $7"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.since)
            .bind(filter.until)
            .bind(filter.kinds())
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
impl HistoryAdmin for PostgresAdmin {
    fn describe(&self) -> String {
        self.name.clone()
    }

    async fn saga_history(
        &self,
        saga_type: &str,
        correlation: &str,
        filter: &HistoryFilter,
    ) -> AdminResult<SagaHistory> {
        saga_history(&PgRows(&self.pool), saga_type, correlation, filter).await
    }

    async fn message_history(&self, message_id: &str, filter: &HistoryFilter) -> AdminResult<MessageHistory> {
        message_history(&PgRows(&self.pool), message_id, filter).await
    }

    async fn find(&self, text: &str, filter: &HistoryFilter) -> AdminResult<FoundHistory> {
        find(&PgRows(&self.pool), text, filter).await
    }
}
