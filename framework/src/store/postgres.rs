//! The Postgres store: the inbox and outbox in the schema `courier`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Row, Transaction};

use crate::error::{Error, ErrorKind, Result};
use crate::message::Envelope;
use crate::message::LockToken;
use crate::store::{
    Begin, Committed, DueTimeouts, OutboxMessage, Store, StoredEnvelope, StoredSaga, Timeout, TimeoutClaim, UnitOfWork,
    db_error,
};

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
    fn transaction(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        Some(&mut *self.tx)
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

    async fn commit(self: Box<Self>) -> Result<Committed> {
        self.tx
            .commit()
            .await
            .map_err(|e| db_error("cannot commit the handler's transaction", e))?;
        Ok(Committed::Pending)
    }

    async fn load_saga(&mut self, saga_type: &str, correlation: &str) -> Result<Option<StoredSaga>> {
        let row =
            sqlx::query("SELECT state::text, version FROM courier.saga WHERE saga_type = $1 AND correlation = $2")
                .bind(saga_type)
                .bind(correlation)
                .fetch_optional(&mut *self.tx)
                .await
                .map_err(|e| db_error("cannot load a saga instance", e))?;
        row.map(|r| {
            let get = |e| db_error("cannot read a saga instance", e);
            Ok(StoredSaga {
                state: r.try_get(0).map_err(get)?,
                version: r.try_get(1).map_err(get)?,
            })
        })
        .transpose()
    }

    async fn save_saga(
        &mut self,
        saga_type: &str,
        correlation: &str,
        state: &str,
        version: Option<i64>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        // A concurrent creation of the same instance makes this INSERT wait for the other
        // transaction, then do nothing: a conflict, and the message is retried.
        let done = match version {
            None => sqlx::query(
                "INSERT INTO courier.saga (saga_type, correlation, state, version, created_at, updated_at) \
                 VALUES ($1, $2, $3::jsonb, 1, $4, $4) ON CONFLICT DO NOTHING",
            )
            .bind(saga_type)
            .bind(correlation)
            .bind(state)
            .bind(now)
            .execute(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot create a saga instance", e))?,
            Some(v) => sqlx::query(
                "UPDATE courier.saga SET state = $3::jsonb, version = version + 1, updated_at = $4 \
                 WHERE saga_type = $1 AND correlation = $2 AND version = $5",
            )
            .bind(saga_type)
            .bind(correlation)
            .bind(state)
            .bind(now)
            .bind(v)
            .execute(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot save a saga instance", e))?,
        };
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(conflict(saga_type, correlation))
        }
    }

    async fn complete_saga(
        &mut self,
        saga_type: &str,
        correlation: &str,
        state: &str,
        version: Option<i64>,
        archive: bool,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let created = match version {
            None => now,
            Some(v) => sqlx::query_scalar::<_, DateTime<Utc>>(
                "DELETE FROM courier.saga WHERE saga_type = $1 AND correlation = $2 AND version = $3 \
                 RETURNING created_at",
            )
            .bind(saga_type)
            .bind(correlation)
            .bind(v)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot delete a saga instance", e))?
            .ok_or_else(|| conflict(saga_type, correlation))?,
        };
        if archive {
            sqlx::query(
                "INSERT INTO courier.saga_archive (saga_type, correlation, state, version, created_at, completed_at) \
                 VALUES ($1, $2, $3::jsonb, $4, $5, $6)",
            )
            .bind(saga_type)
            .bind(correlation)
            .bind(state)
            .bind(version.unwrap_or(0) + 1)
            .bind(created)
            .bind(now)
            .execute(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot archive a saga instance", e))?;
        }
        sqlx::query("DELETE FROM courier.saga_timeout WHERE saga_type = $1 AND correlation = $2")
            .bind(saga_type)
            .bind(correlation)
            .execute(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot delete a completed saga's timeouts", e))?;
        Ok(())
    }

    async fn add_timeouts(
        &mut self,
        endpoint: &str,
        saga_type: &str,
        correlation: &str,
        timeouts: Vec<Timeout>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        for t in timeouts {
            let (json, body) = StoredEnvelope::split(t.envelope)?;
            sqlx::query(
                "INSERT INTO courier.saga_timeout \
                 (id, endpoint, saga_type, correlation, due_at, envelope, body, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8)",
            )
            .bind(&t.id)
            .bind(endpoint)
            .bind(saga_type)
            .bind(correlation)
            .bind(t.due)
            .bind(json)
            .bind(body.as_ref())
            .bind(now)
            .execute(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot store a saga timeout", e))?;
        }
        Ok(())
    }

    async fn cancel_timeouts(&mut self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query("DELETE FROM courier.saga_timeout WHERE id = ANY($1)")
            .bind(ids)
            .execute(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot cancel saga timeouts", e))?;
        Ok(())
    }

    async fn take_timeout(&mut self, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM courier.saga_timeout WHERE id = $1")
            .bind(id)
            .execute(&mut *self.tx)
            .await
            .map_err(|e| db_error("cannot take a fired saga timeout", e))?;
        Ok(done.rows_affected() == 1)
    }
}

fn conflict(saga_type: &str, correlation: &str) -> Error {
    Error::new(ErrorKind::Conflict {
        detail: format!("saga {saga_type} instance {correlation:?} was created or changed concurrently"),
    })
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

    async fn begin(
        &self,
        endpoint: &str,
        message_id: &str,
        _lock: Option<LockToken>,
        now: DateTime<Utc>,
    ) -> Result<Begin> {
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

    async fn purge_inbox(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let done = sqlx::query(
            "DELETE FROM courier.inbox WHERE ctid = ANY(ARRAY( \
             SELECT ctid FROM courier.inbox WHERE endpoint = $3 AND processed_at < $1 LIMIT $2))",
        )
        .bind(before)
        .bind(limit)
        .bind(endpoint)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("cannot purge the inbox", e))?;
        Ok(done.rows_affected())
    }

    async fn claim_due_timeouts(&self, endpoint: &str, claim: TimeoutClaim) -> Result<DueTimeouts> {
        // SKIP LOCKED: instances of the endpoint in several processes claim disjoint rows.
        let rows = sqlx::query(
            "WITH due AS ( \
               SELECT id FROM courier.saga_timeout \
               WHERE endpoint = $1 AND dispatched_at IS NULL AND due_at <= $5 \
               ORDER BY due_at LIMIT $4 FOR UPDATE SKIP LOCKED), \
             lost AS ( \
               SELECT id FROM courier.saga_timeout \
               WHERE endpoint = $1 AND dispatched_at IS NOT NULL AND dispatched_at < $3 \
               ORDER BY due_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
             UPDATE courier.saga_timeout SET dispatched_at = $2 \
             WHERE id IN (SELECT id FROM due UNION ALL SELECT id FROM lost) \
             RETURNING envelope::text, body, due_at",
        )
        .bind(endpoint)
        .bind(claim.now)
        .bind(claim.reclaim_before)
        .bind(claim.limit)
        .bind(claim.due_until)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| db_error("cannot claim due saga timeouts", e))?;
        let to_send = rows
            .into_iter()
            .map(|r| {
                let get = |e| db_error("cannot read a saga timeout", e);
                let json: String = r.try_get(0).map_err(get)?;
                let body: Vec<u8> = r.try_get(1).map_err(get)?;
                let due: DateTime<Utc> = r.try_get(2).map_err(get)?;
                Ok(claim.schedule(StoredEnvelope::join(&json, body)?, due))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DueTimeouts {
            claimed: to_send.len(),
            to_send,
        })
    }

    async fn next_timeout_due(&self, endpoint: &str) -> Result<Option<DateTime<Utc>>> {
        sqlx::query_scalar("SELECT MIN(due_at) FROM courier.saga_timeout WHERE endpoint = $1 AND dispatched_at IS NULL")
            .bind(endpoint)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| db_error("cannot read the next saga timeout", e))
    }

    async fn unclaim_timeouts(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query("UPDATE courier.saga_timeout SET dispatched_at = NULL WHERE id = ANY($1)")
            .bind(ids)
            .execute(&self.pool)
            .await
            .map_err(|e| db_error("cannot release saga timeouts", e))?;
        Ok(())
    }
}
