//! The Postgres store: the inbox and outbox in the schema `courier`; and the options of
//! the pools Courier opens itself (here and for the Postgres transport).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection, Postgres, Row, Transaction};

use crate::endpoint::recoverability::reasons;
use crate::endpoint::timeout_seal::TimeoutSeal;
use crate::error::{Error, ErrorKind, Result};
use crate::message::Envelope;
use crate::message::LockToken;
use crate::store::pg_group::PgGroup;
use crate::store::pg_outbox::{
    OutboxRow, ensure_not_aborted, insert_outbox_with_history, outbox_of, outbox_rows, record_batch,
};
use crate::store::pg_saga::pg_unit_of_work;
use crate::store::{
    Begin, BeginBatch, Claimed, CommitGroup, Committed, DueTimeouts, EndpointSecret, OutboxDeadLetter, OutboxMessage,
    Store, StoredEnvelope, TakenTimeout, TimeoutClaim, db_error,
};

/// How long a pooled connection must have been idle before it is tested (one `Sync`
/// round trip) as it is taken from a pool Courier opened. sqlx tests every connection it
/// hands out by default, which costs a round trip to the server per checkout, about one in
/// six of the handling's round trips on the Postgres transport; a connection in use less
/// than this long ago is taken as it is, and one that died meanwhile fails its first
/// statement, as it would if it died just after the test (docs/postgres-reference.md,
/// "Several processes, a killed process, Postgres going away").
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// The options of every pool Courier opens itself (the transport's and
/// [`PostgresStore::connect`]'s): a connection is tested as it is taken only after
/// [`PING_AFTER_IDLE`] idle; one that fails the test is closed and another taken. A pool
/// the application passes in keeps its own options.
pub(crate) fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

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
        let pool = pool_options()
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
    /// Whether a statement of Courier's ran since the handler's (the history events' or
    /// the outbox insert): it would have failed if the transaction were aborted.
    checked: bool,
    /// Handled events, written with the outgoing messages (one statement), or before the
    /// COMMIT in place of its check when there are none.
    history: Vec<crate::store::pg_history::Prepared>,
}

impl PgWork {
    fn pg_conn(&mut self) -> Result<&mut PgConnection> {
        Ok(&mut self.tx)
    }

    /// Writes the events still kept, if any; they are then the check.
    async fn write_history(&mut self) -> Result<()> {
        if self.history.is_empty() {
            return Ok(());
        }
        let events = std::mem::take(&mut self.history);
        crate::store::pg_history::record_many(&mut self.tx, &events)
            .await
            .map_err(crate::store::pg_group::poisoned_if_aborted)?;
        self.checked = true;
        Ok(())
    }
}

pg_unit_of_work!(PgWork, {
    fn transaction(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        Some(&mut *self.tx)
    }

    /// Kept, and written with the outgoing messages (`store_outgoing`, which follows).
    async fn record_history(&mut self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        self.history.push(crate::store::pg_history::Prepared::new(event)?);
        Ok(())
    }

    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>> {
        let rows = messages
            .into_iter()
            .map(|(destination, is_topic, envelope)| OutboxRow {
                source_id: self.source_id.clone(),
                destination,
                is_topic,
                envelope,
            })
            .collect();
        let events = std::mem::take(&mut self.history);
        let stored = insert_outbox_with_history(&mut self.tx, &self.endpoint, rows, now, &events)
            .await
            .map_err(crate::store::pg_group::poisoned_if_aborted)?;
        // A statement ran after the handler's if there was anything to write.
        self.checked |= !stored.is_empty() || !events.is_empty();
        Ok(stored)
    }

    async fn commit(mut self: Box<Self>) -> Result<Committed> {
        self.write_history().await?;
        if !self.checked {
            ensure_not_aborted(&mut self.tx).await?;
        }
        self.tx
            .commit()
            .await
            .map_err(|e| db_error("cannot commit the handler's transaction", e))?;
        Ok(Committed::Pending)
    }
});

/// `endpoint`'s secret in `courier.endpoint_secret`, made now if it has none: read; when
/// there is no row, a new random secret is inserted unless a row is there (another
/// process may be inserting its own at the same moment: the insert then waits for it and
/// does nothing), and the row is read again; on `conn` (in the caller's transaction, if
/// it has one: the timeout dispatcher's claim reads it too, `claim_due`).
pub(crate) async fn endpoint_secret(
    conn: &mut PgConnection,
    endpoint: &str,
    now: DateTime<Utc>,
) -> Result<EndpointSecret> {
    let found: Option<Vec<u8>> = sqlx::query_scalar("SELECT secret FROM courier.endpoint_secret WHERE endpoint = $1")
        .bind(endpoint)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| db_error("cannot read the endpoint's secret in courier.endpoint_secret (were Courier's migrations applied? Store::migrate)", e))?;
    if let Some(stored) = found {
        return EndpointSecret::stored(&stored, "courier.endpoint_secret", endpoint);
    }
    sqlx::query(
        "INSERT INTO courier.endpoint_secret (endpoint, secret, created_at) VALUES ($1, $2, $3) \
         ON CONFLICT (endpoint) DO NOTHING",
    )
    .bind(endpoint)
    .bind(EndpointSecret::random().as_bytes().as_slice())
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot make the endpoint's secret in courier.endpoint_secret (were Courier's migrations applied? Store::migrate)", e))?;
    let stored: Vec<u8> = sqlx::query_scalar("SELECT secret FROM courier.endpoint_secret WHERE endpoint = $1")
        .bind(endpoint)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| db_error("cannot read the endpoint's secret in courier.endpoint_secret", e))?;
    EndpointSecret::stored(&stored, "courier.endpoint_secret", endpoint)
}

/// Applies Courier's Postgres migrations (the store's and the Postgres transport's: one
/// set, in the schema `courier`), idempotently.
pub(crate) async fn migrate(pool: &PgPool) -> Result<()> {
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
        .execute(pool)
        .await
        .map_err(|e| failed(Box::new(e)))?;
    let mut migrator = sqlx::migrate!("../migrations/postgres");
    migrator.dangerous_set_table_name("courier.migrations");
    migrator.run(pool).await.map_err(|e| failed(Box::new(e)))
}

#[async_trait]
impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<()> {
        migrate(&self.pool).await
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
                checked: false,
                history: Vec::new(),
            })));
        }
        let left = outbox_of(&mut *tx, endpoint, message_id).await?;
        drop(tx);
        Ok(Begin::Duplicate(left))
    }

    fn commit_group(&self, endpoint: &str, message_ids: Vec<String>) -> Option<Arc<dyn CommitGroup>> {
        Some(Arc::new(PgGroup::new(self.pool.clone(), endpoint, message_ids, None)))
    }

    async fn begin_batch(
        &self,
        endpoint: &str,
        members: Vec<(String, Option<LockToken>)>,
        now: DateTime<Utc>,
    ) -> Result<BeginBatch> {
        if members.is_empty() {
            return Ok(BeginBatch::empty());
        }
        let ids: Vec<String> = members.into_iter().map(|(id, _)| id).collect();
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin the batch's transaction", e))?;
        let duplicates = record_batch(&mut tx, endpoint, &ids, now).await?;
        let first_fresh = BeginBatch::first_fresh(&ids, &duplicates);
        let work = first_fresh.map(|id| {
            Box::new(PgWork {
                tx,
                endpoint: endpoint.to_owned(),
                source_id: id,
                checked: false,
                history: Vec::new(),
            }) as Box<dyn crate::store::UnitOfWork>
        });
        Ok(BeginBatch { work, duplicates })
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

    async fn backlog(&self, endpoint: &str) -> Result<Option<crate::store::StoreBacklog>> {
        let row = sqlx::query(
            "SELECT (SELECT count(*) FROM courier.outbox WHERE endpoint = $1), \
                    (SELECT min(created_at) FROM courier.outbox WHERE endpoint = $1), \
                    (SELECT count(*) FROM courier.inbox WHERE endpoint = $1)",
        )
        .bind(endpoint)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| db_error("cannot count the outbox and the inbox", e))?;
        let read = |e| db_error("cannot read the outbox and inbox counts", e);
        let outbox: i64 = row.try_get(0).map_err(read)?;
        let oldest_outbox: Option<DateTime<Utc>> = row.try_get(1).map_err(read)?;
        let inbox: i64 = row.try_get(2).map_err(read)?;
        Ok(Some(crate::store::StoreBacklog {
            outbox: u64::try_from(outbox).unwrap_or(0),
            oldest_outbox,
            inbox: u64::try_from(inbox).unwrap_or(0),
        }))
    }

    fn keeps_history(&self) -> bool {
        true
    }

    /// One statement (the event and its instance rows, `pg_history::record`), atomic on
    /// its own: no transaction around it, one round trip.
    async fn record_history(&self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| db_error("cannot get a connection to record the history of a message", e))?;
        crate::store::pg_history::record(&mut conn, event).await
    }

    async fn purge_history(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| db_error("cannot get a connection to purge the history", e))?;
        crate::store::pg_history::purge(&mut conn, endpoint, before, limit).await
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
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| db_error("cannot claim due saga timeouts", e))?;
        let c = claim_due(&mut conn, endpoint, claim, claim.marked_at).await?;
        Ok(DueTimeouts {
            claimed: c.due.len(),
            to_send: c.due,
            dead_lettered: c.dead_lettered,
            taken: c.taken,
            recorded: false,
        })
    }

    async fn next_timeout_due(&self, endpoint: &str) -> Result<Option<DateTime<Utc>>> {
        sqlx::query_scalar("SELECT MIN(due_at) FROM courier.saga_timeout WHERE endpoint = $1 AND dispatched_at IS NULL")
            .bind(endpoint)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| db_error("cannot read the next saga timeout", e))
    }

    async fn timeouts_sent(&self, ids: &[String], at: DateTime<Utc>) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE courier.saga_timeout SET dispatched_at = GREATEST(dispatched_at, $2) \
             WHERE id = ANY($1) AND dispatched_at IS NOT NULL AND dead_lettered_at IS NULL",
        )
        .bind(ids)
        .bind(at)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("cannot confirm that saga timeouts were sent", e))?;
        Ok(())
    }

    async fn unclaim_timeouts(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        // The send failed: the claim does not count as a dispatch.
        sqlx::query(
            "UPDATE courier.saga_timeout SET dispatched_at = NULL, dispatches = GREATEST(dispatches - 1, 0) \
             WHERE id = ANY($1)",
        )
        .bind(ids)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("cannot release saga timeouts", e))?;
        Ok(())
    }

    async fn dead_letter_timeout(&self, endpoint: &str, id: &str, reason: &str, now: DateTime<Utc>) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE courier.saga_timeout SET dead_lettered_at = $3, dead_letter_reason = $4 \
             WHERE id = $1 AND endpoint = $2",
        )
        .bind(id)
        .bind(endpoint)
        .bind(now)
        .bind(reason)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("cannot mark a saga timeout dead-lettered", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn postpone_timeout_reclaim(&self, endpoint: &str, id: &str, until: DateTime<Utc>) -> Result<()> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| db_error("cannot postpone a saga timeout's reclaim", e))?;
        postpone_reclaim(&mut conn, endpoint, id, until).await
    }

    async fn dead_letter_outbox(&self, id: i64, reason: &str, description: &str, now: DateTime<Utc>) -> Result<bool> {
        // One statement: the row leaves the outbox and lands in the dead letters together.
        let moved = sqlx::query(
            "WITH moved AS (DELETE FROM courier.outbox WHERE id = $1 \
               RETURNING id, endpoint, source_id, destination, is_topic, envelope, body, created_at) \
             INSERT INTO courier.outbox_dead_letters \
               (id, endpoint, source_id, destination, is_topic, envelope, body, created_at, \
                dead_lettered_at, reason, description) \
             SELECT id, endpoint, source_id, destination, is_topic, envelope, body, created_at, $2, $3, $4 \
             FROM moved ON CONFLICT (id) DO NOTHING",
        )
        .bind(id)
        .bind(now)
        .bind(reason)
        .bind(description)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("cannot move an outbox message to the dead letters", e))?;
        Ok(moved.rows_affected() > 0)
    }

    async fn endpoint_secret(&self, endpoint: &str, now: DateTime<Utc>) -> Result<Option<EndpointSecret>> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| db_error("cannot read the endpoint's secret", e))?;
        endpoint_secret(&mut conn, endpoint, now).await.map(Some)
    }

    async fn dead_lettered_outbox(&self, endpoint: &str, limit: i64) -> Result<Vec<OutboxDeadLetter>> {
        let rows = sqlx::query(
            "SELECT id, destination, is_topic, envelope::text, body, source_id, reason, description, \
             dead_lettered_at FROM courier.outbox_dead_letters WHERE endpoint = $1 ORDER BY id LIMIT $2",
        )
        .bind(endpoint)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| db_error("cannot read the outbox dead letters", e))?;
        rows.into_iter()
            .map(|r| {
                let get = |e| db_error("cannot read an outbox dead letter", e);
                let json: String = r.try_get(3).map_err(get)?;
                let body: Vec<u8> = r.try_get(4).map_err(get)?;
                Ok(OutboxDeadLetter {
                    message: OutboxMessage {
                        id: r.try_get(0).map_err(get)?,
                        destination: r.try_get(1).map_err(get)?,
                        is_topic: r.try_get(2).map_err(get)?,
                        envelope: StoredEnvelope::join(&json, body)?,
                    },
                    source_id: r.try_get(5).map_err(get)?,
                    reason: r.try_get(6).map_err(get)?,
                    description: r.try_get(7).map_err(get)?,
                    dead_lettered_at: r.try_get(8).map_err(get)?,
                })
            })
            .collect()
    }
}

/// Claims `endpoint`'s timeouts as `claim` says on `conn`, marking the claimed rows
/// dispatched at `marked_at`: their messages, sealed with the endpoint's secret (made
/// now if it has none; `endpoint/timeout_seal.rs`), the ids of the rows marked
/// dead-lettered instead (sent their most times), and every row taken, for the history.
pub(crate) async fn claim_due(
    conn: &mut sqlx::PgConnection,
    endpoint: &str,
    claim: TimeoutClaim,
    marked_at: DateTime<Utc>,
) -> Result<Claimed> {
    // SKIP LOCKED: instances of the endpoint in several processes claim disjoint rows.
    // SET reads the row as it was: a row sent its most times (`$6`) keeps its claim
    // time and count and gets the dead-letter mark instead; RETURNING reads it as it
    // is now.
    let rows = sqlx::query(
        "WITH due AS ( \
           SELECT id FROM courier.saga_timeout \
           WHERE endpoint = $1 AND dispatched_at IS NULL AND dead_lettered_at IS NULL AND due_at <= $5 \
           ORDER BY due_at LIMIT $4 FOR UPDATE SKIP LOCKED), \
         lost AS ( \
           SELECT id FROM courier.saga_timeout \
           WHERE endpoint = $1 AND dispatched_at IS NOT NULL AND dead_lettered_at IS NULL \
             AND dispatched_at < $3 \
           ORDER BY due_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
         UPDATE courier.saga_timeout SET \
           dispatched_at = CASE WHEN dispatches >= $6 THEN dispatched_at ELSE $2 END, \
           dispatches = CASE WHEN dispatches >= $6 THEN dispatches ELSE dispatches + 1 END, \
           dead_lettered_at = CASE WHEN dispatches >= $6 THEN $7 ELSE dead_lettered_at END, \
           dead_letter_reason = CASE WHEN dispatches >= $6 THEN $8 ELSE dead_letter_reason END \
         WHERE id IN (SELECT id FROM due UNION ALL SELECT id FROM lost) \
         RETURNING envelope::text, body, due_at, id, dead_lettered_at IS NOT NULL, saga_type, correlation, \
           timeout_key, dispatches::int8",
    )
    .bind(endpoint)
    .bind(marked_at)
    .bind(claim.reclaim_before)
    .bind(claim.limit)
    .bind(claim.due_until)
    .bind(i32::try_from(claim.max_dispatches.max(1)).unwrap_or(i32::MAX))
    .bind(claim.now)
    .bind(reasons::TIMEOUT_DISPATCHES_EXHAUSTED)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_error("cannot claim due saga timeouts", e))?;
    let mut claimed = Claimed::default();
    let mut seal = None;
    for r in rows {
        let get = |e| db_error("cannot read a saga timeout", e);
        let json: String = r.try_get(0).map_err(get)?;
        let body: Vec<u8> = r.try_get(1).map_err(get)?;
        let due: DateTime<Utc> = r.try_get(2).map_err(get)?;
        let id: String = r.try_get(3).map_err(get)?;
        let dead: bool = r.try_get(4).map_err(get)?;
        let mut envelope = StoredEnvelope::join(&json, body)?;
        claimed.taken.push(TakenTimeout::of_row(
            id.clone(),
            r.try_get(5).map_err(get)?,
            r.try_get(6).map_err(get)?,
            r.try_get(7).map_err(get)?,
            due,
            r.try_get(8).map_err(get)?,
            dead,
            &envelope,
        ));
        if dead {
            claimed.dead_lettered.push(id);
            continue;
        }
        let seal = match &mut seal {
            Some(seal) => seal,
            None => seal.insert(TimeoutSeal::new(&endpoint_secret(conn, endpoint, claim.now).await?)?),
        };
        seal.seal(endpoint, &mut envelope, due);
        claimed.due.push(claim.schedule(envelope, due));
    }
    Ok(claimed)
}

/// Postpones the reclaim of `endpoint`'s claimed timeout `id` until `until` (see
/// `Store::postpone_timeout_reclaim`), on `conn`.
pub(crate) async fn postpone_reclaim(
    conn: &mut sqlx::PgConnection,
    endpoint: &str,
    id: &str,
    until: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "UPDATE courier.saga_timeout SET dispatched_at = GREATEST(dispatched_at, $3) \
         WHERE id = $1 AND endpoint = $2 AND dispatched_at IS NOT NULL AND dead_lettered_at IS NULL",
    )
    .bind(id)
    .bind(endpoint)
    .bind(until)
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot postpone a saga timeout's reclaim", e))?;
    Ok(())
}
