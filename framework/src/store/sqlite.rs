//! The SQLite store: the inbox and outbox in a SQLite file, tables prefixed `courier_`.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, Sqlite, SqlitePool, Transaction};

use crate::error::Result;
use crate::message::Envelope;
use crate::store::{Begin, OutboxMessage, Store, StoredEnvelope, UnitOfWork, db_error};

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// The inbox and outbox in SQLite, through a sqlx pool. Handler transactions begin with
/// `BEGIN IMMEDIATE` (SQLite has one writer at a time; taking the write lock first means
/// no transaction fails half-way for lack of it).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating it if needed) a SQLite file in WAL mode, synchronous NORMAL.
    ///
    /// # Errors
    /// [`ErrorKind::Storage`](crate::ErrorKind::Storage) if the file cannot be opened.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
        Self::with_options(options).await
    }

    /// Opens a SQLite URL (`sqlite://app.db`, `sqlite::memory:`).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_options(SqliteConnectOptions::from_str(url).map_err(|e| db_error("invalid SQLite URL", e))?).await
    }

    /// The one place a pool is made: creates the file if missing, waits up to 10 s for
    /// the write lock.
    async fn with_options(options: SqliteConnectOptions) -> Result<Self> {
        let options = options.create_if_missing(true).busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(|e| db_error("cannot open the SQLite store", e))?;
        Ok(Self { pool })
    }

    /// A store over the application's own pool.
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

struct SqliteWork {
    tx: Transaction<'static, Sqlite>,
    endpoint: String,
    source_id: String,
}

#[async_trait]
impl UnitOfWork for SqliteWork {
    fn transaction(&mut self) -> &mut (dyn std::any::Any + Send) {
        &mut self.tx
    }

    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>> {
        let mut out = Vec::with_capacity(messages.len());
        for (destination, is_topic, envelope) in messages {
            let kept = envelope.clone();
            let (json, body) = StoredEnvelope::split(envelope)?;
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO courier_outbox (endpoint, source_id, destination, is_topic, envelope, body, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
            )
            .bind(&self.endpoint)
            .bind(&self.source_id)
            .bind(&destination)
            .bind(is_topic)
            .bind(json)
            .bind(body.as_ref())
            .bind(micros(now))
            .fetch_one(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot store an outgoing message", e))?;
            out.push(OutboxMessage {
                id,
                destination,
                is_topic,
                envelope: kept,
            });
        }
        Ok(out)
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.tx
            .commit()
            .await
            .map_err(|e| db_error("cannot commit the handler's transaction", e))
    }
}

fn outbox_rows(rows: Vec<sqlx::sqlite::SqliteRow>) -> Result<Vec<OutboxMessage>> {
    rows.into_iter()
        .map(|r| {
            let get = |e| db_error("cannot read an outbox row", e);
            let json: String = r.try_get(3).map_err(get)?;
            let body: Vec<u8> = r.try_get(4).map_err(get)?;
            Ok(OutboxMessage {
                id: r.try_get(0).map_err(get)?,
                destination: r.try_get(1).map_err(get)?,
                is_topic: r.try_get(2).map_err(get)?,
                envelope: StoredEnvelope::join(&json, body)?,
            })
        })
        .collect()
}

#[async_trait]
impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<()> {
        let mut migrator = sqlx::migrate!("../migrations/sqlite");
        migrator.dangerous_set_table_name("courier_migrations");
        migrator.run(&self.pool).await.map_err(|e| {
            crate::error::Error::with_source(
                crate::error::ErrorKind::Storage {
                    detail: "cannot apply Courier's SQLite migrations".into(),
                    transient: false,
                },
                e,
            )
        })
    }

    async fn begin(&self, endpoint: &str, message_id: &str, now: DateTime<Utc>) -> Result<Begin> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| db_error("cannot begin the handler's transaction", e))?;
        let recorded = sqlx::query(
            "INSERT INTO courier_inbox (endpoint, message_id, processed_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(endpoint)
        .bind(message_id)
        .bind(micros(now))
        .execute(&mut *tx)
        .await
        .map_err(|e| db_error("cannot record the message in the inbox", e))?
        .rows_affected();
        if recorded == 1 {
            return Ok(Begin::Fresh(Box::new(SqliteWork {
                tx,
                endpoint: endpoint.to_owned(),
                source_id: message_id.to_owned(),
            })));
        }
        let rows = sqlx::query(
            "SELECT id, destination, is_topic, envelope, body FROM courier_outbox \
             WHERE endpoint = ?1 AND source_id = ?2 ORDER BY id",
        )
        .bind(endpoint)
        .bind(message_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| db_error("cannot read the outbox", e))?;
        drop(tx);
        Ok(Begin::Duplicate(outbox_rows(rows)?))
    }

    async fn mark_dispatched(&self, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
        sqlx::query("DELETE FROM courier_outbox WHERE id IN (SELECT value FROM json_each(?1))")
            .bind(list)
            .execute(&self.pool)
            .await
            .map_err(|e| db_error("cannot remove dispatched messages from the outbox", e))?;
        Ok(())
    }

    async fn undispatched(&self, endpoint: &str, older_than: DateTime<Utc>, limit: i64) -> Result<Vec<OutboxMessage>> {
        let rows = sqlx::query(
            "SELECT id, destination, is_topic, envelope, body FROM courier_outbox \
             WHERE endpoint = ?3 AND created_at < ?1 ORDER BY id LIMIT ?2",
        )
        .bind(micros(older_than))
        .bind(limit)
        .bind(endpoint)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| db_error("cannot read the outbox", e))?;
        outbox_rows(rows)
    }

    async fn purge_inbox(&self, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let done = sqlx::query(
            "DELETE FROM courier_inbox WHERE (endpoint, message_id) IN \
             (SELECT endpoint, message_id FROM courier_inbox WHERE processed_at < ?1 LIMIT ?2)",
        )
        .bind(micros(before))
        .bind(limit)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("cannot purge the inbox", e))?;
        Ok(done.rows_affected())
    }
}
