//! Stores: where an endpoint keeps the inbox of processed message ids and the outbox of
//! messages its handlers sent, in the same transaction as the handler's own writes. See
//! `docs/stores.md`.
//!
//! This module holds what every store shares: the traits ([`Store`], [`UnitOfWork`],
//! [`CommitGroup`]) and the types they exchange (outbox messages, saga state and timeouts,
//! the backlog). Beside it: `errors` (the naming of storage errors), `secret` (an
//! endpoint's secret), `stored_envelope` (the envelope as a store keeps it), `history`
//! (a workflow's history as stored, written by `sqlite_history` and `pg_history`),
//! `saga_work` (the saga and history methods the units of work share), `timeout_claim`
//! (what the timeout dispatcher's claim asks and gets back), and the stores themselves
//! (`sqlite`, `postgres`, with their saga tables).
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod saga_work;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use saga_work::unit_of_work_with_sagas;

#[cfg(feature = "sqlite")]
pub(crate) mod app_schema;
pub(crate) mod history;
#[cfg(feature = "postgres")]
pub(crate) mod pg_group;
#[cfg(feature = "postgres")]
pub(crate) mod pg_history;
#[cfg(feature = "postgres")]
pub(crate) mod pg_outbox;
#[cfg(feature = "postgres")]
pub(crate) mod pg_saga;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite_history;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite_saga;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite_tx;

mod errors;
mod secret;
mod stored_envelope;
mod timeout_claim;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, LockToken};

#[cfg(feature = "sqlite")]
pub(crate) use errors::db_cause;
pub(crate) use errors::db_error;
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
pub use secret::EndpointSecret;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use stored_envelope::StoredEnvelope;
pub(crate) use timeout_claim::Claimed;
pub use timeout_claim::{DueTimeouts, TakenTimeout, TimeoutClaim};

/// How long processed message ids are kept by default.
pub const DEFAULT_INBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A message a handler sent, as the outbox keeps it until it is dispatched.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// The row's id in the outbox.
    pub id: i64,
    /// The queue or topic.
    pub destination: String,
    /// Whether the destination is a topic.
    pub is_topic: bool,
    /// The message, with the id it will keep when dispatched.
    pub envelope: Envelope,
}

/// A saga timeout as stored: due at `due`, then sent to the saga's endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeout {
    /// Its id, which is also its message's id.
    pub id: String,
    /// The key it was requested under: at most one pending timeout of an instance has a
    /// given key (`None`: it replaces nothing).
    pub key: Option<String>,
    /// When it is due.
    pub due: DateTime<Utc>,
    /// The message, addressed to the saga's endpoint.
    pub envelope: Envelope,
}

/// A saga instance as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSaga {
    /// The state, as JSON.
    pub state: String,
    /// Its version: 1 when created, one more at each update (the optimistic concurrency
    /// check; not the shape's version).
    pub version: i64,
    /// The version of the state's shape it was written at
    /// ([`Saga::VERSION`](crate::saga::Saga::VERSION); 1 for rows stored before versions
    /// existed).
    pub state_version: i64,
}

fn saga_unsupported<T>() -> Result<T> {
    Err(Error::new(ErrorKind::Unsupported {
        transport: "store",
        capability: "sagas",
        rule: "S7",
        reason: "this store does not keep saga instances; use PostgresStore, SqliteStore or Embedded::store",
    }))
}

fn history_unsupported<T>() -> Result<T> {
    Err(Error::new(ErrorKind::Unsupported {
        transport: "store",
        capability: "history",
        rule: "S7",
        reason: "this store does not keep a workflow's history; use PostgresStore, SqliteStore, Embedded::store or \
                 PostgresTransport::store, or turn the endpoint's history off",
    }))
}

/// How much of the handling of a message one transaction of a store covers, for an
/// endpoint receiving from a given transport ([`Store::unit_of_work_scope`]); an endpoint
/// logs it when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnitOfWorkScope {
    /// The inbox record, the handler's writes, saga state and timeout rows and the outbox
    /// rows commit together; completing the received message, dispatching the outbox
    /// (sends and publishes), sending due saga timeouts and scheduling delayed retries
    /// are separate steps, each at least once (the inbox drops the duplicates).
    Outbox,
    /// As [`All`](Self::All), except delayed retries: the scheduled copy is sent, then
    /// the received message completed (two steps; a crash between them handles the
    /// message twice, and the inbox drops the second).
    AllButDelayedRetries,
    /// One transaction of the broker's own database: the completion of the received
    /// message, the inbox record, the handler's writes, saga state and timeouts, the
    /// messages it sends and publishes and, for a failed handling, its delayed retry
    /// (the scheduled copy with the completion). Due saga timeouts are enqueued in the
    /// transaction that claims them.
    All,
}

/// What [`Store::begin`] found.
pub enum Begin {
    /// The message was not processed before: its id is now recorded in the returned unit
    /// of work, which commits or rolls back with the handler's effects.
    Fresh(Box<dyn UnitOfWork>),
    /// The message's effects were committed before (a redelivery): do not handle it
    /// again. Outbox messages of that earlier handling that were never dispatched are
    /// returned, to be dispatched now.
    Duplicate(Vec<OutboxMessage>),
}

impl std::fmt::Debug for Begin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Begin::Fresh(_) => f.write_str("Fresh"),
            Begin::Duplicate(left) => write!(f, "Duplicate({} undispatched)", left.len()),
        }
    }
}

/// What [`Store::begin_batch`] found: ONE transaction for the members of a batch that
/// were not processed before.
pub struct BeginBatch {
    /// The transaction in which the fresh members' ids are recorded, to commit or roll
    /// back with the batch handler's effects; `None` when every member was processed
    /// before.
    pub work: Option<Box<dyn UnitOfWork>>,
    /// Per member, in the order given: `None` when it is fresh (recorded in `work`), or
    /// the outbox messages of its earlier handling that were never dispatched.
    pub duplicates: Vec<Option<Vec<OutboxMessage>>>,
}

impl std::fmt::Debug for BeginBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeginBatch")
            .field("work", &self.work.as_ref().map(|_| "open"))
            .field("fresh", &self.duplicates.iter().filter(|d| d.is_none()).count())
            .field("duplicates", &self.duplicates.iter().filter(|d| d.is_some()).count())
            .finish()
    }
}

impl BeginBatch {
    /// A batch of no member: what a store that can begin batches answers an endpoint
    /// asking at start.
    pub fn empty() -> Self {
        BeginBatch {
            work: None,
            duplicates: Vec::new(),
        }
    }

    /// The id of the first member `duplicates` says is fresh (the batch's outbox rows are
    /// kept under it), if any.
    pub(crate) fn first_fresh(ids: &[String], duplicates: &[Option<Vec<OutboxMessage>>]) -> Option<String> {
        ids.iter()
            .zip(duplicates)
            .find(|(_, d)| d.is_none())
            .map(|(id, _)| id.clone())
    }
}

/// What a committed unit of work leaves to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Committed {
    /// The outbox messages are to be dispatched and the received message completed.
    Pending,
    /// As `Pending`, but the outbox messages were stored at the commit (a commit group
    /// stores all its members' messages in one statement): these are the ones to
    /// dispatch, not what [`UnitOfWork::store_outgoing`] returned.
    Stored(Vec<OutboxMessage>),
    /// The transaction also sent the messages and completed the received message (the
    /// transport and the store share one database): nothing is left to do.
    Settled,
}

/// One open transaction of a store, for one handled message.
#[async_trait]
pub trait UnitOfWork: Send {
    /// The connection the transaction runs on, for
    /// [`Context::transaction`](crate::Context::transaction) (the `DB::Connection` of the
    /// store's database, for example `sqlx::PgConnection`); `None` once committed.
    fn transaction(&mut self) -> Option<&mut (dyn Any + Send)>;
    /// Stores the messages the handlers sent, in this transaction; returns those left to
    /// dispatch after the commit, with their outbox ids (none when the commit sends them).
    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>>;
    /// Commits the handler's writes, the inbox record and the outbox together.
    async fn commit(self: Box<Self>) -> Result<Committed>;

    /// Writes a handled message's history event in this transaction: it commits with the
    /// effects it describes, or not at all.
    async fn record_history(&mut self, event: &history::HistoryEvent) -> Result<()> {
        let _ = event;
        history_unsupported()
    }

    /// Loads a saga instance.
    async fn load_saga(&mut self, saga_type: &str, correlation: &str) -> Result<Option<StoredSaga>> {
        let _ = (saga_type, correlation);
        saga_unsupported()
    }

    /// Creates an instance (`version` `None`) or updates it if it is still at `version`,
    /// with `state` written at the shape's version `state_version`. An instance created or
    /// changed concurrently is [`ErrorKind::Conflict`].
    async fn save_saga(
        &mut self,
        saga_type: &str,
        correlation: &str,
        state: &str,
        state_version: u32,
        version: Option<i64>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let _ = (saga_type, correlation, state, state_version, version, now);
        saga_unsupported()
    }

    /// Ends an instance: deletes it (or, with `archive`, moves it with `state`, of the
    /// shape's version `state_version`, to the archive) and deletes its timeouts. A
    /// concurrent change is [`ErrorKind::Conflict`].
    #[allow(clippy::too_many_arguments)]
    async fn complete_saga(
        &mut self,
        saga_type: &str,
        correlation: &str,
        state: &str,
        state_version: u32,
        version: Option<i64>,
        archive: bool,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let _ = (saga_type, correlation, state, state_version, version, archive, now);
        saga_unsupported()
    }

    /// Stores timeouts of an instance, to be sent to `endpoint` when due.
    async fn add_timeouts(
        &mut self,
        endpoint: &str,
        saga_type: &str,
        correlation: &str,
        timeouts: Vec<Timeout>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let _ = (endpoint, saga_type, correlation, timeouts, now);
        saga_unsupported()
    }

    /// Deletes timeouts (unknown ids are ignored).
    async fn cancel_timeouts(&mut self, ids: &[String]) -> Result<()> {
        let _ = ids;
        saga_unsupported()
    }

    /// Takes a fired timeout: deletes its record and says whether it was there (`false`:
    /// it was cancelled, or its saga completed). A dead-lettered timeout is there: its
    /// dead letter, resubmitted, is handled.
    async fn take_timeout(&mut self, id: &str) -> Result<bool> {
        let _ = id;
        saga_unsupported()
    }

    /// Deletes the instance's pending (not dead-lettered) timeouts stored under `keys`.
    async fn cancel_timeout_keys(&mut self, saga_type: &str, correlation: &str, keys: &[String]) -> Result<()> {
        let _ = (saga_type, correlation, keys);
        saga_unsupported()
    }

    /// Leaves a marker that instance `correlation` of `saga_type` completed at `now`, kept
    /// until `expires` (`SagaOptions::remember_completed`), replacing an earlier marker of
    /// the instance; deletes a few markers that expired, so that the table holds about the
    /// live ones.
    async fn mark_saga_completed(
        &mut self,
        saga_type: &str,
        correlation: &str,
        now: DateTime<Utc>,
        expires: DateTime<Utc>,
    ) -> Result<()> {
        let _ = (saga_type, correlation, now, expires);
        saga_unsupported()
    }

    /// When instance `correlation` of `saga_type` completed, if its marker
    /// ([`mark_saga_completed`](Self::mark_saga_completed)) has not expired at `now`.
    async fn saga_completed_at(
        &mut self,
        saga_type: &str,
        correlation: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>> {
        let _ = (saga_type, correlation, now);
        saga_unsupported()
    }

    /// The correlation of the instance whose correlation property `name` is `value`.
    async fn find_saga_by_property(&mut self, saga_type: &str, name: &str, value: &str) -> Result<Option<String>> {
        let _ = (saga_type, name, value);
        saga_unsupported()
    }

    /// Sets correlation properties `(name, value)` of an instance (replacing its earlier
    /// value of each name). A value another instance holds is not taken: the first such
    /// is returned as `(name, that instance's correlation)`, and the caller fails the
    /// handling (which rolls back whatever this call did).
    async fn set_saga_properties(
        &mut self,
        saga_type: &str,
        correlation: &str,
        properties: &[(String, String)],
    ) -> Result<Option<(String, String)>> {
        let _ = (saga_type, correlation, properties);
        saga_unsupported()
    }
}

/// Several messages' handlings sharing one transaction of a store (a group commit).
///
/// The endpoint forms a group of messages received together and calls
/// [`begin`](Self::begin) once per member (by its index among the ids the group was made
/// with) or [`leave`](Self::leave) when a member's handling ends before the store (an
/// unknown message type, a lost lock, a shutdown). Members take turns on the one
/// connection; a member whose handling fails is rolled back alone (to its savepoint); the
/// transaction commits once every member has committed, failed or left, and each member's
/// [`UnitOfWork::commit`] returns then, with its outbox messages
/// ([`Committed::Stored`]). See `docs/stores.md`.
#[async_trait]
pub trait CommitGroup: Send + Sync {
    /// As [`Store::begin`], for member `member`, whose received message has the lock
    /// `lock` (a store that shares the transport's database completes it in the group's
    /// transaction, with the member's effects).
    async fn begin(self: Arc<Self>, member: usize, lock: Option<LockToken>, now: DateTime<Utc>) -> Result<Begin>;
    /// Member `member` will not begin, or its `begin` was stopped before it returned
    /// (never after `begin` returned).
    fn leave(&self, member: usize);
}

/// Where an endpoint keeps its inbox and outbox.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short name for logs (`postgres`, `sqlite`).
    fn name(&self) -> &'static str;
    /// Applies Courier's migrations (idempotent).
    async fn migrate(&self) -> Result<()>;
    /// Opens the transaction of one message and records `(endpoint, message_id)` in its
    /// inbox; or says the message was processed before. When two transactions record the
    /// same id at once, the second waits for the first and then sees a duplicate (or,
    /// if the first rolled back, records it). `lock` is the received message's lock: a
    /// store that shares the transport's database completes the message in the same
    /// transaction ([`Committed::Settled`]); other stores ignore it.
    async fn begin(
        &self,
        endpoint: &str,
        message_id: &str,
        lock: Option<LockToken>,
        now: DateTime<Utc>,
    ) -> Result<Begin>;
    /// Opens ONE transaction for a batch handler's call: records each member's
    /// `(endpoint, message id)` in the inbox in it, or finds it processed before. The ids
    /// are distinct. A member's `lock` is completed in the transaction by a store that
    /// shares the transport's database (as in [`begin`](Self::begin)); the commit then
    /// answers [`Committed::Settled`] for all of them. Messages the batch sends are kept
    /// in the outbox under the first fresh member's id.
    ///
    /// An endpoint with a batch handler calls it with no member when it starts, to learn
    /// whether the store can. The default cannot.
    ///
    /// # Errors
    /// The default: [`ErrorKind::InvalidOperation`] saying that batch handlers need a
    /// store that implements it. A storage error (nothing was recorded).
    async fn begin_batch(
        &self,
        endpoint: &str,
        members: Vec<(String, Option<LockToken>)>,
        now: DateTime<Utc>,
    ) -> Result<BeginBatch> {
        let _ = (endpoint, members, now);
        Err(Error::new(ErrorKind::InvalidOperation {
            reason: format!(
                "store {} cannot begin a batch (Store::begin_batch): batch handlers need one of Courier's stores \
                 (PostgresStore, SqliteStore, Embedded::store, PostgresTransport::store) or a store that \
                 implements it",
                self.name()
            ),
        }))
    }

    /// How much of a handling one transaction of this store covers when the endpoint
    /// receives from `transport` (see [`UnitOfWorkScope`]). The default:
    /// [`UnitOfWorkScope::Outbox`].
    fn unit_of_work_scope(&self, transport: &dyn crate::transport::Transport) -> UnitOfWorkScope {
        let _ = transport;
        UnitOfWorkScope::Outbox
    }

    /// Schedules a failed message's delayed retry and completes the received message in
    /// ONE transaction, when this store shares the transport's database and `lock` is a
    /// lock of that transport (else `Ok(false)`: the endpoint sends the copy, then
    /// completes). `copy` goes to the queue `endpoint`, due at its
    /// `scheduled_enqueue_time`. `timeout` is the id of the saga timeout whose message
    /// this is: its reclaim is postponed until `due` in the same transaction (see
    /// [`postpone_timeout_reclaim`](Self::postpone_timeout_reclaim)).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`] when the lock was lost meanwhile (nothing is scheduled);
    /// a storage error (nothing happened; the message comes back).
    async fn schedule_retry(
        &self,
        endpoint: &str,
        lock: LockToken,
        copy: Envelope,
        timeout: Option<&str>,
        due: DateTime<Utc>,
    ) -> Result<bool> {
        let _ = (endpoint, lock, copy, timeout, due);
        Ok(false)
    }

    /// A group of handlings to commit together, for the messages `message_ids` (distinct),
    /// or `None` when this store commits each handling alone (the default). An endpoint
    /// calls it once with no ids when it starts, to learn which.
    fn commit_group(&self, endpoint: &str, message_ids: Vec<String>) -> Option<Arc<dyn CommitGroup>> {
        let _ = (endpoint, message_ids);
        None
    }

    /// Removes dispatched messages from the outbox.
    async fn mark_dispatched(&self, ids: &[i64]) -> Result<()>;
    /// Outbox messages of `endpoint` stored before `older_than` and still there (left by
    /// a process that died between its commit and its dispatch, or by a dispatch that
    /// failed), oldest first.
    async fn undispatched(&self, endpoint: &str, older_than: DateTime<Utc>, limit: i64) -> Result<Vec<OutboxMessage>>;
    /// Deletes `endpoint`'s inbox records processed before `before`, at most `limit` of
    /// them in one short statement (an index on `(endpoint, processed_at)` finds them);
    /// returns how many went.
    async fn purge_inbox(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64>;

    /// Claims `endpoint`'s timeouts as `claim` says, marking them dispatched. This crate's
    /// stores seal each claimed timeout's message with the endpoint's secret
    /// (`courier::saga::headers::TIMEOUT_SEAL`, over the message and its timeout headers);
    /// an endpoint whose store keeps a secret refuses a timeout's message without that
    /// seal as forged. A store of your own that keeps a secret and claims timeouts itself
    /// should wrap one of this crate's, as only they can seal.
    async fn claim_due_timeouts(&self, endpoint: &str, claim: TimeoutClaim) -> Result<DueTimeouts> {
        let _ = (endpoint, claim);
        saga_unsupported()
    }

    /// When `endpoint`'s next unclaimed timeout is due.
    async fn next_timeout_due(&self, endpoint: &str) -> Result<Option<DateTime<Utc>>> {
        let _ = endpoint;
        saga_unsupported()
    }

    /// Confirms that the messages of the claimed timeouts `ids` were sent at `at`: their
    /// rows are marked dispatched at `at` (never earlier than they were), so they wait the
    /// whole reclaim time before being sent again. Unsent, a claim is taken again after
    /// its short lease (see [`TimeoutClaim::marked_at`]). Stores that enqueue at the claim
    /// need not implement it.
    async fn timeouts_sent(&self, ids: &[String], at: DateTime<Utc>) -> Result<()> {
        let _ = (ids, at);
        Ok(())
    }

    /// Reverts a claim whose messages could not be sent, so the next round sends them
    /// (the claim does not count as a dispatch: see [`TimeoutClaim::max_dispatches`]).
    async fn unclaim_timeouts(&self, ids: &[String]) -> Result<()> {
        let _ = ids;
        saga_unsupported()
    }

    /// Records that the message of `endpoint`'s timeout `id` was dead-lettered with
    /// `reason`: the row stays (for operators, and for its dead letter if it is
    /// resubmitted), and the dispatcher never sends it again. Returns whether there was
    /// such a row (a forged or already handled timeout has none).
    async fn dead_letter_timeout(&self, endpoint: &str, id: &str, reason: &str, now: DateTime<Utc>) -> Result<bool> {
        let _ = (endpoint, id, reason, now);
        saga_unsupported()
    }

    /// The message of `endpoint`'s claimed timeout `id` waits for a delayed retry due at
    /// `until`: the dispatcher does not take the claim back (and send a second copy)
    /// before `until` plus the usual wait.
    async fn postpone_timeout_reclaim(&self, endpoint: &str, id: &str, until: DateTime<Utc>) -> Result<()> {
        let _ = (endpoint, id, until);
        saga_unsupported()
    }

    /// Moves the outbox row `id` to the outbox's dead letters, with why (an endpoint does
    /// this when the transport refuses the message for good, so that it is not retried
    /// forever and the rows behind it go on): one transaction takes it out of the outbox
    /// and keeps it, with `reason`, `description` and `now`, where
    /// [`dead_lettered_outbox`](Self::dead_lettered_outbox) shows it. Returns whether the
    /// row was there (`false`: dispatched or moved already). The default refuses
    /// (`Unsupported`): the row then stays in the outbox.
    async fn dead_letter_outbox(&self, id: i64, reason: &str, description: &str, now: DateTime<Utc>) -> Result<bool> {
        let _ = (id, reason, description, now);
        Err(Error::new(ErrorKind::Unsupported {
            transport: "store",
            capability: "outbox dead letters",
            rule: "S2.5",
            reason: "this store keeps no outbox dead letters; use PostgresStore, SqliteStore or Embedded::store",
        }))
    }

    /// What `endpoint` has in the store now: its outbox rows not yet dispatched (and when
    /// the oldest was stored) and its inbox records. One counting query; an endpoint asks
    /// only when sampling its metrics (`EndpointBuilder::sample_queue_metrics`). `None`:
    /// the store cannot tell (the default).
    async fn backlog(&self, endpoint: &str) -> Result<Option<StoreBacklog>> {
        let _ = endpoint;
        Ok(None)
    }

    /// `endpoint`'s outbox dead letters, oldest first, at most `limit` of them: what an
    /// operator looks at (on Postgres the table `courier.outbox_dead_letters`, on SQLite
    /// `courier_outbox_dead_letters`; see `docs/stores.md`).
    async fn dead_lettered_outbox(&self, endpoint: &str, limit: i64) -> Result<Vec<OutboxDeadLetter>> {
        let _ = (endpoint, limit);
        Ok(Vec::new())
    }

    /// `endpoint`'s secret, shared by all its processes through this store: made of 32
    /// random bytes by the first call for that endpoint (a read; when there is no row one
    /// `INSERT ... ON CONFLICT DO NOTHING`, then a read, so processes starting together
    /// agree) and the same ever after; `now` is recorded with it. An endpoint reads it once
    /// when it starts and seals the count of each delayed retry with it, so that a count a
    /// producer wrote cannot make a message skip its retries (see `docs/endpoints.md`,
    /// "Recoverability"), and checks with it the seal on each saga timeout's message, which
    /// this crate's stores write when they claim the timeout
    /// ([`claim_due_timeouts`](Self::claim_due_timeouts); see `docs/sagas.md`, "Timeouts").
    ///
    /// The default returns `Ok(None)`, for a store that has no table for it: the endpoint
    /// then trusts the count as it finds it, as an endpoint without a store does. A store
    /// that wraps another should delegate.
    ///
    /// # Errors
    /// A storage error (transient when retrying can help; a missing table means Courier's
    /// migrations were not applied: [`migrate`](Self::migrate)); [`ErrorKind::Corrupt`]
    /// when the stored secret is not 32 bytes (a row written by hand).
    async fn endpoint_secret(&self, endpoint: &str, now: DateTime<Utc>) -> Result<Option<EndpointSecret>> {
        let _ = (endpoint, now);
        Ok(None)
    }

    /// Whether this store keeps a workflow's history: its units of work implement
    /// [`UnitOfWork::record_history`], and it [`record_history`](Self::record_history)
    /// and [`purge_history`](Self::purge_history). An endpoint with history on refuses
    /// to start on a store that does not.
    fn keeps_history(&self) -> bool {
        false
    }

    /// Writes a history event on its own: an attempt that rolled back (retried,
    /// dead-lettered), a duplicate the inbox dropped.
    ///
    /// # Errors
    /// A storage error; [`ErrorKind::Unsupported`] on a store that keeps no history.
    async fn record_history(&self, event: &history::HistoryEvent) -> Result<()> {
        let _ = event;
        history_unsupported()
    }

    /// Deletes up to `limit` of `endpoint`'s history events older than `before`, oldest
    /// first; how many. The endpoint's janitor calls it until it deletes fewer.
    ///
    /// # Errors
    /// A storage error.
    async fn purge_history(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let _ = (endpoint, before, limit);
        Ok(0)
    }
}

/// What an endpoint has in the store ([`Store::backlog`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreBacklog {
    /// Outbox rows stored and not yet dispatched.
    pub outbox: u64,
    /// When the oldest of them was stored.
    pub oldest_outbox: Option<DateTime<Utc>>,
    /// Inbox records (message ids processed within the retention).
    pub inbox: u64,
}

impl StoreBacklog {
    /// A backlog of `outbox` rows, the oldest stored at `oldest_outbox`, and `inbox`
    /// records (for stores outside this crate).
    pub fn new(outbox: u64, oldest_outbox: Option<DateTime<Utc>>, inbox: u64) -> Self {
        Self {
            outbox,
            oldest_outbox,
            inbox,
        }
    }
}

/// An outbox message that could never be dispatched, moved aside with why
/// ([`Store::dead_letter_outbox`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OutboxDeadLetter {
    /// The message as it was in the outbox (`id` is its outbox row's id).
    pub message: OutboxMessage,
    /// The id of the handled message whose transaction stored it.
    pub source_id: String,
    /// Why it was moved (for example
    /// [`DISPATCH_REFUSED`](crate::recoverability::reasons::DISPATCH_REFUSED)).
    pub reason: String,
    /// What was wrong with it, naming the message and the transport's error.
    pub description: String,
    /// When it was moved, by the endpoint's clock.
    pub dead_lettered_at: DateTime<Utc>,
}
