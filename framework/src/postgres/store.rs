//! The store on the transport's own database: `PostgresTransport::store()`. For a message
//! this transport delivered, ONE Postgres transaction records the inbox, holds the
//! handler's writes and the saga state, inserts the messages the handler sent straight
//! into their queues (no outbox) and completes the received message, fenced by its lock
//! token. Everything else (messages of other transports, timeouts, the inbox purge) is
//! the [`PostgresStore`]'s on the same pool. The sends and the fenced completion
//! themselves, alone and in a commit group, are in `in_tx.rs`.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Transaction};

use super::PostgresTransport;
use super::in_tx::{complete_many_in, own_lock, send_and_complete, send_in};
pub(crate) use super::rows::Lock;
use super::rows::read_token;
use crate::error::Result;
use crate::message::{Envelope, LockToken};
use crate::store::pg_group::{PgGroup, poisoned_if_aborted};
use crate::store::pg_outbox::{OutboxRow, ensure_not_aborted, insert_outbox, outbox_of, record_batch};
use crate::store::pg_saga::pg_unit_of_work;
use crate::store::postgres::{claim_due, postpone_reclaim};
use crate::store::{
    Begin, BeginBatch, CommitGroup, Committed, DueTimeouts, EndpointSecret, OutboxDeadLetter, OutboxMessage,
    PostgresStore, Store, StoreBacklog, TimeoutClaim, UnitOfWorkScope, db_error,
};
use crate::transport::Transport;

/// An endpoint store in the Postgres transport's database (see
/// [`PostgresTransport::store`]).
///
/// With this transport as the endpoint's transport, the handling of a message is one
/// transaction: the inbox record, the handler's writes
/// ([`Context::transaction`](crate::Context::transaction) gives `sqlx::PgConnection`),
/// saga state and timeouts, the messages it sent (inserted into their queues, receivable
/// when the transaction commits) and the completion of the received message commit
/// together or not at all. The completion is fenced by the lock token: if the lock was
/// lost meanwhile (another process has the message), the transaction rolls back and the
/// endpoint is told `LockLost`. Messages received from another transport go through the
/// outbox, as with [`PostgresStore`].
#[derive(Debug, Clone)]
pub struct PgTransportStore {
    transport: PostgresTransport,
    inner: PostgresStore,
}

impl PostgresTransport {
    /// A store in this transport's database, on its pool (see [`PgTransportStore`]).
    /// Apply the migrations first (the transport's `open` does by default).
    pub fn store(&self) -> PgTransportStore {
        PgTransportStore {
            transport: self.clone(),
            inner: PostgresStore::from_pool(self.shared.pool.clone()),
        }
    }
}

struct TxWork {
    tx: Transaction<'static, Postgres>,
    transport: PostgresTransport,
    endpoint: String,
    source_id: String,
    /// The received message's lock, when this transport delivered it: completed in the
    /// transaction.
    lock: Option<Lock>,
    /// The other received messages of a batch this transport delivered (`begin_batch`):
    /// completed in the transaction with `lock`.
    more_locks: Vec<Lock>,
    /// Messages to insert at commit (when the lock is ours).
    staged: Vec<(String, bool, Envelope)>,
    checked: bool,
}

impl TxWork {
    fn pg_conn(&mut self) -> Result<&mut PgConnection> {
        Ok(&mut self.tx)
    }
}

pg_unit_of_work!(TxWork, {
    fn transaction(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        Some(&mut *self.tx)
    }

    /// Written at once; the statement runs after the handler's, so it is the check that
    /// the handler did not leave the transaction aborted (the commit's `SELECT 1` saved).
    async fn record_history(&mut self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        crate::store::pg_history::record_after_handler(&mut self.tx, event).await?;
        self.checked = true;
        Ok(())
    }

    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>> {
        if self.lock.is_some() {
            self.staged.extend(messages);
            return Ok(Vec::new());
        }
        let rows = messages
            .into_iter()
            .map(|(destination, is_topic, envelope)| OutboxRow {
                source_id: self.source_id.clone(),
                destination,
                is_topic,
                envelope,
            })
            .collect();
        let stored = insert_outbox(&mut self.tx, &self.endpoint, rows, now).await?;
        self.checked |= !stored.is_empty();
        Ok(stored)
    }

    async fn commit(mut self: Box<Self>) -> Result<Committed> {
        let Some(lock) = self.lock else {
            if !self.checked {
                ensure_not_aborted(&mut self.tx).await?;
            }
            self.tx
                .commit()
                .await
                .map_err(|e| db_error("cannot commit the handler's transaction", e))?;
            return Ok(Committed::Pending);
        };
        // The completion's statements are sent before the COMMIT: one of them finds a
        // transaction the handler left aborted (SQLSTATE 25P02), as `ensure_not_aborted`
        // would, one round trip fewer.
        let staged = std::mem::take(&mut self.staged);
        let now = self.transport.shared.clock.now();
        let woken = if staged.is_empty() && !self.more_locks.is_empty() {
            // A batch that sent nothing: every completion in one statement.
            self.more_locks.push(lock);
            complete_many_in(&mut self.tx, &self.more_locks, now)
                .await
                .map_err(poisoned_if_aborted)?;
            Vec::new()
        } else {
            let woken = send_and_complete(&mut self.tx, &self.transport, lock, staged)
                .await
                .map_err(poisoned_if_aborted)?;
            if !self.more_locks.is_empty() {
                complete_many_in(&mut self.tx, &self.more_locks, now)
                    .await
                    .map_err(poisoned_if_aborted)?;
            }
            woken
        };
        self.tx
            .commit()
            .await
            .map_err(|e| db_error("cannot commit the handler's transaction", e))?;
        self.transport.shared.wake_after_commit(woken);
        Ok(Committed::Settled)
    }
});

#[async_trait]
impl Store for PgTransportStore {
    fn name(&self) -> &'static str {
        "postgres-transport"
    }

    async fn migrate(&self) -> Result<()> {
        self.inner.migrate().await
    }

    async fn begin(
        &self,
        endpoint: &str,
        message_id: &str,
        lock: Option<LockToken>,
        now: DateTime<Utc>,
    ) -> Result<Begin> {
        self.transport.shared.check_open()?;
        let lock = lock.and_then(|t| read_token(self.transport.shared.tag, t));
        let mut tx = self
            .transport
            .shared
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
            return Ok(Begin::Fresh(Box::new(TxWork {
                tx,
                transport: self.transport.clone(),
                endpoint: endpoint.to_owned(),
                source_id: message_id.to_owned(),
                lock,
                more_locks: Vec::new(),
                staged: Vec::new(),
                checked: false,
            })));
        }
        let left = outbox_of(&mut *tx, endpoint, message_id).await?;
        drop(tx);
        Ok(Begin::Duplicate(left))
    }

    /// One transaction: the batch's inbox records, the handler's writes, what it sent
    /// (into its queues) and the completion of every fresh member this transport
    /// delivered, fenced by their locks.
    async fn begin_batch(
        &self,
        endpoint: &str,
        members: Vec<(String, Option<LockToken>)>,
        now: DateTime<Utc>,
    ) -> Result<BeginBatch> {
        if members.is_empty() {
            return Ok(BeginBatch::empty());
        }
        self.transport.shared.check_open()?;
        let ids: Vec<String> = members.iter().map(|(id, _)| id.clone()).collect();
        let mut tx = self
            .transport
            .shared
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin the batch's transaction", e))?;
        let duplicates = record_batch(&mut tx, endpoint, &ids, now).await?;
        let Some(first) = BeginBatch::first_fresh(&ids, &duplicates) else {
            return Ok(BeginBatch { work: None, duplicates });
        };
        let mut locks = members
            .into_iter()
            .zip(&duplicates)
            .filter(|(_, d)| d.is_none())
            .filter_map(|((_, lock), _)| own_lock(&self.transport, lock));
        let lock = locks.next();
        let work = TxWork {
            tx,
            transport: self.transport.clone(),
            endpoint: endpoint.to_owned(),
            source_id: first,
            lock,
            more_locks: locks.collect(),
            staged: Vec::new(),
            checked: false,
        };
        Ok(BeginBatch {
            work: Some(Box::new(work)),
            duplicates,
        })
    }

    /// Everything is one transaction when the endpoint receives from a Postgres transport
    /// on this database (its lock tokens carry the database's tag).
    fn unit_of_work_scope(&self, transport: &dyn Transport) -> UnitOfWorkScope {
        match transport.as_any().and_then(|t| t.downcast_ref::<PostgresTransport>()) {
            Some(other) if other.shared.tag == self.transport.shared.tag => UnitOfWorkScope::All,
            _ => UnitOfWorkScope::Outbox,
        }
    }

    /// For a message of this database: ONE transaction inserts the scheduled copy into
    /// the endpoint's queue, postpones the timeout's reclaim and completes the received
    /// message, fenced by its lock.
    async fn schedule_retry(
        &self,
        endpoint: &str,
        lock: LockToken,
        copy: Envelope,
        timeout: Option<&str>,
        due: DateTime<Utc>,
    ) -> Result<bool> {
        self.transport.shared.check_open()?;
        let Some(lock) = own_lock(&self.transport, Some(lock)) else {
            return Ok(false);
        };
        let mut tx = self
            .transport
            .shared
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin scheduling a delayed retry", e))?;
        if let Some(id) = timeout {
            postpone_reclaim(&mut tx, endpoint, id, due).await?;
        }
        let woken = send_and_complete(&mut tx, &self.transport, lock, vec![(endpoint.to_owned(), false, copy)]).await?;
        tx.commit()
            .await
            .map_err(|e| db_error("cannot commit the delayed retry", e))?;
        self.transport.shared.wake_after_commit(woken);
        Ok(true)
    }

    fn commit_group(&self, endpoint: &str, message_ids: Vec<String>) -> Option<Arc<dyn CommitGroup>> {
        Some(Arc::new(PgGroup::new(
            self.transport.shared.pool.clone(),
            endpoint,
            message_ids,
            Some(Arc::new(self.transport.clone())),
        )))
    }

    async fn mark_dispatched(&self, ids: &[i64]) -> Result<()> {
        self.inner.mark_dispatched(ids).await
    }

    async fn undispatched(&self, endpoint: &str, older_than: DateTime<Utc>, limit: i64) -> Result<Vec<OutboxMessage>> {
        self.inner.undispatched(endpoint, older_than, limit).await
    }

    async fn purge_inbox(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        self.inner.purge_inbox(endpoint, before, limit).await
    }

    fn keeps_history(&self) -> bool {
        true
    }

    async fn record_history(&self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        self.inner.record_history(event).await
    }

    async fn purge_history(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        self.inner.purge_history(endpoint, before, limit).await
    }

    /// When the endpoint receives from this database (`claim.enqueue`): ONE transaction
    /// claims the due timeouts and inserts their messages into the endpoint's queue
    /// (scheduled for their due time), so nothing is left to send and a claim is never
    /// lost between the two. Otherwise as [`PostgresStore`]'s: the messages are handed
    /// back to be sent.
    async fn claim_due_timeouts(&self, endpoint: &str, claim: TimeoutClaim) -> Result<DueTimeouts> {
        if !claim.enqueue {
            return self.inner.claim_due_timeouts(endpoint, claim).await;
        }
        self.transport.shared.check_open()?;
        let mut tx = self
            .transport
            .shared
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin claiming saga timeouts", e))?;
        // Enqueued in this transaction: marked sent at the claim, reclaimed only after
        // the whole reclaim wait.
        let crate::store::Claimed {
            due,
            dead_lettered,
            taken,
        } = claim_due(&mut tx, endpoint, claim, claim.now).await?;
        let mut woken = Vec::new();
        if !due.is_empty() {
            send_in(
                &mut tx,
                &self.transport,
                endpoint,
                false,
                &due,
                claim.now,
                &mut woken,
                None,
            )
            .await?;
        }
        if claim.history {
            for t in &taken {
                crate::store::pg_history::record(
                    &mut tx,
                    &crate::store::history::timeout_event(endpoint, t, claim.now),
                )
                .await?;
            }
        }
        tx.commit()
            .await
            .map_err(|e| db_error("cannot commit the claimed saga timeouts", e))?;
        self.transport.shared.wake_after_commit(woken);
        Ok(DueTimeouts {
            claimed: due.len(),
            to_send: Vec::new(),
            dead_lettered,
            recorded: claim.history,
            taken,
        })
    }

    async fn next_timeout_due(&self, endpoint: &str) -> Result<Option<DateTime<Utc>>> {
        self.inner.next_timeout_due(endpoint).await
    }

    async fn timeouts_sent(&self, ids: &[String], at: DateTime<Utc>) -> Result<()> {
        self.inner.timeouts_sent(ids, at).await
    }

    async fn unclaim_timeouts(&self, ids: &[String]) -> Result<()> {
        self.inner.unclaim_timeouts(ids).await
    }

    async fn dead_letter_timeout(&self, endpoint: &str, id: &str, reason: &str, now: DateTime<Utc>) -> Result<bool> {
        self.inner.dead_letter_timeout(endpoint, id, reason, now).await
    }

    async fn postpone_timeout_reclaim(&self, endpoint: &str, id: &str, until: DateTime<Utc>) -> Result<()> {
        self.inner.postpone_timeout_reclaim(endpoint, id, until).await
    }

    async fn dead_letter_outbox(&self, id: i64, reason: &str, description: &str, now: DateTime<Utc>) -> Result<bool> {
        self.inner.dead_letter_outbox(id, reason, description, now).await
    }

    async fn backlog(&self, endpoint: &str) -> Result<Option<StoreBacklog>> {
        self.inner.backlog(endpoint).await
    }

    async fn dead_lettered_outbox(&self, endpoint: &str, limit: i64) -> Result<Vec<OutboxDeadLetter>> {
        self.inner.dead_lettered_outbox(endpoint, limit).await
    }

    async fn endpoint_secret(&self, endpoint: &str, now: DateTime<Utc>) -> Result<Option<EndpointSecret>> {
        self.inner.endpoint_secret(endpoint, now).await
    }
}
