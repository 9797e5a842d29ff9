//! Sagas, timeouts and the outbox in SQLite: the statements the SQLite store's admin
//! ([`SqliteAdmin`]) and the embedded broker's ([`EmbeddedAdmin`](super::EmbeddedAdmin))
//! share (their tables are the same), reads on a pool, the completion on a connection
//! in the caller's transaction.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteRow};
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::{
    AdminError, AdminResult, CompletedSaga, OutboxEntry, PendingTimeout, SagaFilter, SagaInstance, SagaSummary,
    SagaTypeSummary, StoreAdmin, TimeoutFilter, TimeoutState, check_reason, log_completed, page_size,
};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, ErrorKind};

pub(crate) fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub(crate) fn from_micros(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(v).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Reads column `i` of a row of Courier's tables.
pub(crate) fn col<'r, T>(row: &'r SqliteRow, i: usize) -> AdminResult<T>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(i)
        .map_err(|e| AdminError::db("cannot read a row of Courier's tables", e))
}

/// A text column another program may have written with bytes that are not UTF-8 (SQLite
/// stores what it is given), as an operator reads it ([`shown_bytes`](super::model::shown_bytes)):
/// such a row is listed, not a failure of the whole listing.
pub(crate) fn text_col(row: &SqliteRow, i: usize) -> AdminResult<Option<String>> {
    let raw: Option<Vec<u8>> = col(row, i)?;
    Ok(raw.map(|r| super::model::shown_bytes(&r)))
}

pub(crate) async fn saga_types(pool: &SqlitePool) -> AdminResult<Vec<SagaTypeSummary>> {
    let rows = sqlx::query(
        "SELECT saga_type, COUNT(*), MIN(updated_at) FROM courier_saga GROUP BY saga_type ORDER BY saga_type",
    )
    .fetch_all(pool)
    .await
    .map_err(|e| AdminError::db("cannot list the saga types", e))?;
    rows.iter()
        .map(|r| {
            Ok(SagaTypeSummary {
                saga_type: col(r, 0)?,
                instances: count(col(r, 1)?),
                oldest_updated_at: col::<Option<i64>>(r, 2)?.map(from_micros),
            })
        })
        .collect()
}

const PENDING: &str =
    "(SELECT COUNT(*) FROM courier_saga_timeout t WHERE t.saga_type = s.saga_type AND t.correlation = s.correlation)";

fn summary(r: &SqliteRow) -> AdminResult<SagaSummary> {
    Ok(SagaSummary {
        saga_type: col(r, 0)?,
        correlation: col(r, 1)?,
        version: col(r, 2)?,
        created_at: from_micros(col(r, 3)?),
        updated_at: from_micros(col(r, 4)?),
        pending_timeouts: count(col(r, 5)?),
    })
}

pub(crate) async fn sagas(pool: &SqlitePool, saga_type: &str, filter: &SagaFilter) -> AdminResult<Vec<SagaSummary>> {
    let sql = format!(
        "SELECT s.saga_type, s.correlation, s.version, s.created_at, s.updated_at, {PENDING} AS pending \
         FROM courier_saga s WHERE s.saga_type = ?1 \
         AND (?2 IS NULL OR instr(s.correlation, ?2) > 0) \
         AND (?3 IS NULL OR s.updated_at < ?3) \
         AND (?4 IS NULL OR (?4 = 1) = ({PENDING} > 0)) \
         ORDER BY s.updated_at, s.correlation LIMIT ?5"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(saga_type)
        .bind(filter.correlation.as_deref())
        .bind(filter.updated_before.map(micros))
        .bind(filter.has_pending_timeout.map(i64::from))
        .bind(page_size(filter.limit))
        .fetch_all(pool)
        .await
        .map_err(|e| AdminError::db("cannot list saga instances", e))?;
    rows.iter().map(summary).collect()
}

pub(crate) async fn saga(pool: &SqlitePool, saga_type: &str, correlation: &str) -> AdminResult<SagaInstance> {
    let sql = format!(
        "SELECT s.saga_type, s.correlation, s.version, s.created_at, s.updated_at, {PENDING}, s.state_version, \
         s.state FROM courier_saga s WHERE s.saga_type = ?1 AND s.correlation = ?2"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(saga_type)
        .bind(correlation)
        .fetch_optional(pool)
        .await
        .map_err(|e| AdminError::db("cannot read a saga instance", e))?
        .ok_or_else(|| AdminError::not_found(format!("saga {saga_type} instance {correlation:?}")))?;
    let state: String = col(&row, 7)?;
    let state = serde_json::from_str(&state).map_err(|e| {
        AdminError::from(Error::new(ErrorKind::Corrupt {
            detail: format!("the state of saga {saga_type} instance {correlation:?} is not JSON: {e}"),
        }))
    })?;
    let timeouts = timeouts_of(pool, saga_type, correlation).await?;
    Ok(SagaInstance {
        summary: summary(&row)?,
        state_version: col(&row, 6)?,
        state,
        timeouts,
    })
}

/// Deletes an instance with its timeouts and properties, in the caller's transaction.
pub(crate) async fn complete(
    conn: &mut SqliteConnection,
    saga_type: &str,
    correlation: &str,
) -> AdminResult<CompletedSaga> {
    let version: i64 =
        sqlx::query_scalar("DELETE FROM courier_saga WHERE saga_type = ?1 AND correlation = ?2 RETURNING version")
            .bind(saga_type)
            .bind(correlation)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| AdminError::db("cannot delete a saga instance", e))?
            .ok_or_else(|| AdminError::not_found(format!("saga {saga_type} instance {correlation:?}")))?;
    let timeouts = sqlx::query("DELETE FROM courier_saga_timeout WHERE saga_type = ?1 AND correlation = ?2")
        .bind(saga_type)
        .bind(correlation)
        .execute(&mut *conn)
        .await
        .map_err(|e| AdminError::db("cannot delete a saga instance's timeouts", e))?
        .rows_affected();
    sqlx::query("DELETE FROM courier_saga_property WHERE saga_type = ?1 AND correlation = ?2")
        .bind(saga_type)
        .bind(correlation)
        .execute(&mut *conn)
        .await
        .map_err(|e| AdminError::db("cannot delete a saga instance's properties", e))?;
    Ok(CompletedSaga {
        version,
        timeouts_removed: timeouts,
    })
}

fn timeout(r: &SqliteRow) -> AdminResult<PendingTimeout> {
    let dispatched_at = col::<Option<i64>>(r, 7)?.map(from_micros);
    let dead = col::<Option<i64>>(r, 8)?;
    Ok(PendingTimeout {
        id: col(r, 0)?,
        endpoint: col(r, 1)?,
        saga_type: col(r, 2)?,
        correlation: col(r, 3)?,
        key: col(r, 4)?,
        message_type: col(r, 5)?,
        due_at: from_micros(col(r, 6)?),
        dispatched_at,
        state: match (dead, dispatched_at) {
            (Some(_), _) => TimeoutState::DeadLettered,
            (None, Some(_)) => TimeoutState::Dispatched,
            (None, None) => TimeoutState::Waiting,
        },
        dead_letter_reason: col(r, 9)?,
    })
}

const TIMEOUT_COLUMNS: &str = "SELECT id, endpoint, saga_type, correlation, timeout_key, \
     json_extract(envelope, '$.message_type'), due_at, dispatched_at, dead_lettered_at, dead_letter_reason \
     FROM courier_saga_timeout";

/// The pending timeouts of one instance, earliest due first.
async fn timeouts_of(pool: &SqlitePool, saga_type: &str, correlation: &str) -> AdminResult<Vec<PendingTimeout>> {
    let sql = format!("{TIMEOUT_COLUMNS} WHERE saga_type = ?1 AND correlation = ?2 ORDER BY due_at, id");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(saga_type)
        .bind(correlation)
        .fetch_all(pool)
        .await
        .map_err(|e| AdminError::db("cannot list a saga instance's timeouts", e))?;
    rows.iter().map(timeout).collect()
}

pub(crate) async fn timeouts(
    pool: &SqlitePool,
    filter: &TimeoutFilter,
    now: DateTime<Utc>,
) -> AdminResult<Vec<PendingTimeout>> {
    // Overdue: due and not sent; or sent, due more than the grace ago, and not handled.
    let sql = format!(
        "{TIMEOUT_COLUMNS} WHERE ?1 = 0 OR (dead_lettered_at IS NULL AND due_at <= ?2 AND (dispatched_at IS NULL \
         OR (due_at <= ?3 AND dispatched_at <= ?3))) ORDER BY due_at, id LIMIT ?4"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(i64::from(filter.overdue_only))
        .bind(micros(now))
        .bind(micros(now - filter.grace))
        .bind(page_size(filter.limit))
        .fetch_all(pool)
        .await
        .map_err(|e| AdminError::db("cannot list timeouts", e))?;
    rows.iter().map(timeout).collect()
}

fn outbox_entry(r: &SqliteRow, dead: bool) -> AdminResult<OutboxEntry> {
    Ok(OutboxEntry {
        id: col(r, 0)?,
        endpoint: col(r, 1)?,
        source_id: col(r, 2)?,
        destination: col(r, 3)?,
        is_topic: col::<i64>(r, 4)? != 0,
        message_id: col(r, 5)?,
        message_type: col(r, 6)?,
        created_at: from_micros(col(r, 7)?),
        dead_letter_reason: if dead { col(r, 8)? } else { None },
        dead_letter_description: if dead { col(r, 9)? } else { None },
    })
}

pub(crate) async fn outbox(pool: &SqlitePool, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
    let rows = sqlx::query(
        "SELECT id, endpoint, source_id, destination, is_topic, json_extract(envelope, '$.message_id'), \
         json_extract(envelope, '$.message_type'), created_at FROM courier_outbox ORDER BY id LIMIT ?1",
    )
    .bind(page_size(limit))
    .fetch_all(pool)
    .await
    .map_err(|e| AdminError::db("cannot list the outbox", e))?;
    rows.iter().map(|r| outbox_entry(r, false)).collect()
}

pub(crate) async fn outbox_dead_letters(pool: &SqlitePool, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
    let rows = sqlx::query(
        "SELECT id, endpoint, source_id, destination, is_topic, json_extract(envelope, '$.message_id'), \
         json_extract(envelope, '$.message_type'), created_at, reason, description FROM courier_outbox_dead_letters \
         ORDER BY id LIMIT ?1",
    )
    .bind(page_size(limit))
    .fetch_all(pool)
    .await
    .map_err(|e| AdminError::db("cannot list the outbox's dead letters", e))?;
    rows.iter().map(|r| outbox_entry(r, true)).collect()
}

/// A pool of query-only connections to an existing SQLite file (nothing is created).
pub(crate) async fn read_only_pool(path: &Path) -> AdminResult<SqlitePool> {
    if !path.exists() {
        return Err(AdminError::not_found(format!("the file {}", path.display())));
    }
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .busy_timeout(std::time::Duration::from_secs(5))
        .pragma("query_only", "ON");
    SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .map_err(|e| {
            AdminError::unavailable(
                path.display().to_string(),
                crate::store::db_error("cannot open the SQLite file", e),
            )
        })
}

/// The sagas, timeouts and outbox of a [`SqliteStore`](crate::SqliteStore)'s file.
#[derive(Debug, Clone)]
pub struct SqliteAdmin {
    pub(super) pool: SqlitePool,
    clock: Arc<dyn Clock>,
    name: String,
}

impl SqliteAdmin {
    /// An admin over the store's pool (the application's, or
    /// [`SqliteStore::pool`](crate::SqliteStore::pool)); times from the system clock.
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            clock: Arc::new(SystemClock),
            name: "sqlite store".into(),
        }
    }

    /// Opens the store's existing file `path` (nothing is created or migrated).
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if there is no such file, [`AdminError::Unavailable`] if
    /// it cannot be opened.
    pub async fn open(path: impl AsRef<Path>) -> AdminResult<Self> {
        let path = path.as_ref();
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(std::time::Duration::from_secs(10));
        if !path.exists() {
            return Err(AdminError::not_found(format!("the file {}", path.display())));
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .map_err(|e| {
                AdminError::unavailable(
                    path.display().to_string(),
                    crate::store::db_error("cannot open the SQLite store", e),
                )
            })?;
        Ok(Self {
            pool,
            clock: Arc::new(SystemClock),
            name: format!("sqlite store {}", path.display()),
        })
    }

    /// Measures ages and overdue timeouts with this clock (the endpoints' clock).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

#[async_trait]
impl StoreAdmin for SqliteAdmin {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    async fn saga_types(&self) -> AdminResult<Vec<SagaTypeSummary>> {
        saga_types(&self.pool).await
    }

    async fn sagas(&self, saga_type: &str, filter: &SagaFilter) -> AdminResult<Vec<SagaSummary>> {
        sagas(&self.pool, saga_type, filter).await
    }

    async fn saga(&self, saga_type: &str, correlation: &str) -> AdminResult<SagaInstance> {
        saga(&self.pool, saga_type, correlation).await
    }

    async fn complete_saga(&self, saga_type: &str, correlation: &str, reason: &str) -> AdminResult<CompletedSaga> {
        check_reason(reason)?;
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| AdminError::db("cannot connect to the SQLite store", e))?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(|e| AdminError::db("cannot begin completing a saga instance", e))?;
        let done = match complete(&mut conn, saga_type, correlation).await {
            Ok(done) => done,
            Err(e) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                return Err(e);
            }
        };
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .map_err(|e| AdminError::db("cannot commit completing a saga instance", e))?;
        log_completed(&self.name, saga_type, correlation, &done, reason);
        Ok(done)
    }

    async fn timeouts(&self, filter: &TimeoutFilter) -> AdminResult<Vec<PendingTimeout>> {
        timeouts(&self.pool, filter, self.clock.now()).await
    }

    async fn outbox(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        outbox(&self.pool, limit).await
    }

    async fn outbox_dead_letters(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        outbox_dead_letters(&self.pool, limit).await
    }
}

/// The RabbitMQ transport's schedule store in this file (`courier_amqp_scheduled`, and the
/// entities it recorded), read only by the operations API: for
/// [`AmqpAdmin::connect`](crate::admin::AmqpAdmin::connect).
#[cfg(feature = "amqp")]
impl From<&SqliteAdmin> for crate::ScheduleStore {
    fn from(admin: &SqliteAdmin) -> Self {
        crate::ScheduleStore::Sqlite(crate::store::SqliteStore::from_pool(admin.pool.clone()))
    }
}
