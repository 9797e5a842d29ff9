//! The Postgres store: the inbox and outbox in the schema `courier`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Row, Transaction};

use crate::error::{Error, ErrorKind, Result};
use crate::message::Envelope;
use crate::store::{Begin, OutboxMessage, Store, StoredEnvelope, UnitOfWork, db_error};

/// The inbox and outbox in Postgres, in the schema `courier`, through a sqlx pool.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects a pool of up to 16 connections to `url`
    /// (`postgres://user:password@host:5432/database`).
    ///
    /// # Errors
    /// [`ErrorKind::Storage`] if the server cannot be reached (transient) or refuses.
    pub async fn connect(url: &str) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(url)
            .await
            .map_err(|e| db_error("cannot connect to Postgres", e))?;
        Ok(Self { pool })
    }

    /// A store over the application's own pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

struct PgWork {
    tx: Transaction<'static, Postgres>,
    endpoint: String,
    source_id: String,
}

#[async_trait]
impl UnitOfWork for PgWork {
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
                "INSERT INTO courier.outbox (endpoint, source_id, destination, is_topic, envelope, body, created_at) \
                 VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7) RETURNING id",
            )
            .bind(&self.endpoint)
            .bind(&self.source_id)
            .bind(&destination)
            .bind(is_topic)
            .bind(json)
            .bind(body.as_ref())
            .bind(now)
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

fn outbox_rows(rows: Vec<sqlx::postgres::PgRow>) -> Result<Vec<OutboxMessage>> {
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
impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<()> {
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| {
            Error::with_source(
                ErrorKind::Storage {
                    detail: "cannot apply Courier's Postgres migrations".into(),
                    transient: false,
                },
                e,
            )
        };
        // The migrations table lives in the schema too, so it must exist first.
        sqlx::query("CREATE SCHEMA IF NOT EXISTS courier")
            .execute(&self.pool)
            .await
            .map_err(|e| failed(Box::new(e)))?;
        let mut migrator = sqlx::migrate!("../migrations/postgres");
        migrator.dangerous_set_table_name("courier.migrations");
        migrator.run(&self.pool).await.map_err(|e| failed(Box::new(e)))
    }

    async fn begin(&self, endpoint: &str, message_id: &str, now: DateTime<Utc>) -> Result<Begin> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin the handler's transaction", e))?;
        let recorded = sqlx::query(
            "INSERT INTO courier.inbox (endpoint, message_id, processed_at) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(endpoint)
        .bind(message_id)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(|e| db_error("cannot record the message in the inbox", e))?
        .rows_affected();
        if recorded == 1 {
            return Ok(Begin::Fresh(Box::new(PgWork {
                tx,
                endpoint: endpoint.to_owned(),
                source_id: message_id.to_owned(),
            })));
        }
        let rows = sqlx::query(
            "SELECT id, destination, is_topic, envelope::text, body FROM courier.outbox \
             WHERE endpoint = $1 AND source_id = $2 ORDER BY id",
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
        sqlx::query("DELETE FROM courier.outbox WHERE id = ANY($1)")
            .bind(ids)
            .execute(&self.pool)
            .await
            .map_err(|e| db_error("cannot remove dispatched messages from the outbox", e))?;
        Ok(())
    }

    async fn undispatched(&self, endpoint: &str, older_than: DateTime<Utc>, limit: i64) -> Result<Vec<OutboxMessage>> {
        let rows = sqlx::query(
            "SELECT id, destination, is_topic, envelope::text, body FROM courier.outbox \
             WHERE endpoint = $3 AND created_at < $1 ORDER BY id LIMIT $2",
        )
        .bind(older_than)
        .bind(limit)
        .bind(endpoint)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| db_error("cannot read the outbox", e))?;
        outbox_rows(rows)
    }

    async fn purge_inbox(&self, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let done = sqlx::query(
            "DELETE FROM courier.inbox WHERE ctid = ANY(ARRAY( \
             SELECT ctid FROM courier.inbox WHERE processed_at < $1 LIMIT $2))",
        )
        .bind(before)
        .bind(limit)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("cannot purge the inbox", e))?;
        Ok(done.rows_affected())
    }
}
