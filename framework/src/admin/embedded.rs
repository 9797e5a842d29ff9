//! The operations API on the embedded broker's file: its queues and dead letters, and the
//! sagas, timeouts and outbox of [`Embedded::store`] kept in the same file.
//!
//! Reads are queries on query-only connections (WAL readers: they neither wait for the
//! engine nor hold it up); changes go through the engine's own connection
//! (`embedded/admin.rs`), one transaction per message. A file whose broker runs in
//! another process can only be read: SQLite allows one writer, and the running broker
//! keeps state of the file in memory (sequence numbers, waiting receivers) that a second
//! writer would not update. To change it, run the operation inside the application
//! ([`EmbeddedAdmin::new`] on its broker) or stop it first.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::SqlitePool;
use sqlx::sqlite::SqliteRow;

use super::model::{failure_chain, failure_text};
use super::sqlite::{self, col, from_micros, micros, text_col};
use super::{
    AdminError, AdminResult, BatchOutcome, BodyView, CompletedSaga, DeadLetter, DeadLetterSummary, EntityKind,
    OutboxEntry, Page, PendingTimeout, QueueAdmin, QueueSummary, SagaFilter, SagaInstance, SagaSummary,
    SagaTypeSummary, StoreAdmin, TimeoutFilter, check_reason, log_completed, page_size,
};
use crate::clock::{Clock, SystemClock};
use crate::embedded::{Embedded, Moved};
use crate::message::{Properties, SequenceNumber};

/// The operations API on an embedded broker's file (queues, dead letters, sagas,
/// timeouts, outbox).
#[derive(Debug, Clone)]
pub struct EmbeddedAdmin {
    /// The broker, when this process runs it (changes need it).
    broker: Option<Embedded>,
    pub(super) pool: SqlitePool,
    clock: Arc<dyn Clock>,
    name: String,
}

/// Why a change is refused on a file another process runs.
const READ_ONLY: &str = "the broker's file is in use by a running process, so it is open read-only here: \
     stop that process first, or run the operation inside it (courier::admin::EmbeddedAdmin::new on its broker)";

impl EmbeddedAdmin {
    /// The operations API on a broker this process runs: reads and changes.
    pub fn new(broker: Embedded) -> Self {
        Self {
            pool: broker.read_pool().clone(),
            clock: broker.clock(),
            broker: Some(broker),
            name: "embedded broker".into(),
        }
    }

    /// Opens an existing broker file. When no process runs it, this opens the broker (its
    /// stale locks are released, as at every open) and everything works; when another
    /// process runs it, the file is opened read-only and changes are refused
    /// ([`is_read_only`](Self::is_read_only)).
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if there is no such file (nothing is created);
    /// [`AdminError::Unavailable`] if it cannot be opened.
    pub async fn open(path: impl AsRef<Path>) -> AdminResult<Self> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(AdminError::not_found(format!("the broker file {}", path.display())));
        }
        if in_use(path) {
            return Self::open_read_only(path).await;
        }
        let broker = Embedded::open(path)
            .await
            .map_err(|e| AdminError::unavailable(path.display().to_string(), e))?;
        Ok(Self {
            name: format!("embedded broker {}", path.display()),
            ..Self::new(broker)
        })
    }

    /// Opens an existing broker file read-only, whether or not a process runs it, and
    /// without taking its lock: an application can open the broker meanwhile. Changes are
    /// refused ([`is_read_only`](Self::is_read_only)). The web console serves a file so,
    /// opening the broker only for each change.
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if there is no such file (nothing is created);
    /// [`AdminError::Unavailable`] if it cannot be opened.
    pub async fn open_read_only(path: impl AsRef<Path>) -> AdminResult<Self> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(AdminError::not_found(format!("the broker file {}", path.display())));
        }
        Ok(Self {
            broker: None,
            pool: sqlite::read_only_pool(path).await?,
            clock: Arc::new(SystemClock),
            name: format!("embedded broker {}", path.display()),
        })
    }

    /// Whether a process runs the broker of the file at `path` (holds its lock file
    /// `<path>.lock`). The check takes the lock for an instant when it is free.
    pub fn is_in_use(path: impl AsRef<Path>) -> bool {
        in_use(path.as_ref())
    }

    /// Whether changes are refused (another process runs the broker).
    pub fn is_read_only(&self) -> bool {
        self.broker.is_none()
    }

    /// Closes the broker this admin opened (with [`open`](Self::open)) or was given.
    pub async fn close(&self) {
        if let Some(b) = &self.broker {
            crate::Transport::close(b).await;
        }
    }

    fn writer(&self) -> AdminResult<&Embedded> {
        self.broker.as_ref().ok_or_else(|| AdminError::refused(READ_ONLY))
    }

    /// The id and kind of a queue, topic or subscription (`topic/subscriptions/name`).
    async fn entity(&self, name: &str) -> AdminResult<(i64, EntityKind)> {
        let found: Option<(i64, i64)> = match name.split_once("/subscriptions/") {
            Some((topic, sub)) => sqlx::query_as(
                "SELECT s.id, s.kind FROM courier_entity s JOIN courier_entity t ON t.id = s.parent \
                 WHERE t.parent = 0 AND t.name = ?1 AND s.name = ?2 AND s.kind = 2",
            )
            .bind(topic)
            .bind(sub),
            None => sqlx::query_as("SELECT id, kind FROM courier_entity WHERE parent = 0 AND name = ?1").bind(name),
        }
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot look up a queue", e))?;
        match found {
            Some((id, 0)) => Ok((id, EntityKind::Queue)),
            Some((id, 2)) => Ok((id, EntityKind::Subscription)),
            Some((_, _)) => Err(AdminError::refused(format!(
                "{name} is a topic: its messages are in its subscriptions (topic/subscriptions/name)"
            ))),
            None => Err(AdminError::not_found(format!("queue {name}"))),
        }
    }

    /// The broker, for a change of the dead letters of `queue` (a queue or a
    /// subscription; a topic holds none).
    async fn queue_for_change(&self, queue: &str) -> AdminResult<&Embedded> {
        let broker = self.writer()?;
        self.entity(queue).await?;
        Ok(broker)
    }
}

/// Whether another process holds the broker file's lock.
fn in_use(path: &Path) -> bool {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    match std::fs::OpenOptions::new().write(true).open(&name) {
        Ok(file) => matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// The properties column (JSON; read as bytes: another program may have written bytes
/// that are not UTF-8, which shows no properties rather than failing the listing).
fn properties(json: Option<Vec<u8>>) -> Properties {
    json.and_then(|j| serde_json::from_slice(&j).ok()).unwrap_or_default()
}

fn delivery_count(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn summary(r: &SqliteRow) -> AdminResult<DeadLetterSummary> {
    let headers = properties(col(r, 7)?);
    let description = text_col(r, 6)?;
    Ok(DeadLetterSummary {
        sequence_number: col(r, 0)?,
        message_id: text_col(r, 1)?.unwrap_or_default(),
        message_type: text_col(r, 2)?,
        enqueued_at: from_micros(col(r, 3)?),
        delivery_count: delivery_count(col(r, 4)?),
        reason: text_col(r, 5)?,
        error: failure_text(&headers, description.as_deref()),
        resubmit_refused: None,
    })
}

#[async_trait]
impl QueueAdmin for EmbeddedAdmin {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    async fn queues(&self) -> AdminResult<Vec<QueueSummary>> {
        let entities: Vec<(i64, i64, String, Option<String>)> = sqlx::query_as(
            "SELECT e.id, e.kind, e.name, p.name FROM courier_entity e \
             LEFT JOIN courier_entity p ON e.kind = 2 AND p.id = e.parent",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot list the queues", e))?;
        // State 5 here: locked, with a lock that has not expired (an expired one is active).
        let counts: Vec<(i64, i64, i64, Option<i64>)> = sqlx::query_as(
            "SELECT entity_id, CASE WHEN state = 4 AND locked_until > ?1 THEN 5 WHEN state = 4 THEN 0 ELSE state END \
             AS s, COUNT(*), MIN(enqueued_at) FROM courier_message GROUP BY entity_id, s",
        )
        .bind(micros(self.clock.now()))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot count the queues' messages", e))?;
        let mut out: Vec<QueueSummary> = entities
            .into_iter()
            .map(|(id, kind, name, parent)| {
                let mut q = QueueSummary {
                    name: match parent {
                        Some(topic) => format!("{topic}/subscriptions/{name}"),
                        None => name,
                    },
                    kind: match kind {
                        1 => EntityKind::Topic,
                        2 => EntityKind::Subscription,
                        _ => EntityKind::Queue,
                    },
                    active: 0,
                    locked: 0,
                    scheduled: 0,
                    deferred: 0,
                    dead_lettered: 0,
                    oldest_enqueued_at: None,
                };
                for &(_, state, n, oldest) in counts.iter().filter(|c| c.0 == id) {
                    let n = u64::try_from(n).unwrap_or(0);
                    match state {
                        0 | 5 => {
                            if state == 0 {
                                q.active += n;
                            } else {
                                q.locked += n;
                            }
                            let oldest = oldest.map(from_micros);
                            q.oldest_enqueued_at = match (q.oldest_enqueued_at, oldest) {
                                (Some(a), Some(b)) => Some(a.min(b)),
                                (a, b) => a.or(b),
                            };
                        }
                        1 => q.scheduled += n,
                        2 => q.deferred += n,
                        _ => q.dead_lettered += n,
                    }
                }
                q
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn dead_letters(
        &self,
        queue: &str,
        after: SequenceNumber,
        limit: u32,
    ) -> AdminResult<Page<DeadLetterSummary>> {
        let (entity, _) = self.entity(queue).await?;
        let limit = page_size(limit);
        let rows = sqlx::query(
            "SELECT seq, message_id, message_type, enqueued_at, delivery_count, dl_reason, dl_description, properties \
             FROM courier_message WHERE entity_id = ?1 AND state = 3 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .bind(entity)
        .bind(after)
        .bind(limit + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot list dead letters", e))?;
        let total: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier_message WHERE entity_id = ?1 AND state = 3")
            .bind(entity)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot count dead letters", e))?;
        let items = rows.iter().map(summary).collect::<AdminResult<Vec<_>>>()?;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Ok(Page::of(items, limit, u64::try_from(total).unwrap_or(0)))
    }

    async fn dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<DeadLetter> {
        let (entity, _) = self.entity(queue).await?;
        let r = sqlx::query(
            "SELECT seq, message_id, message_type, correlation_id, causation_id, content_type, session_id, \
             enqueued_at, delivery_count, dl_reason, dl_description, dl_source, properties, body \
             FROM courier_message WHERE entity_id = ?1 AND seq = ?2 AND state = 3",
        )
        .bind(entity)
        .bind(sequence_number)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot read a dead letter", e))?
        .ok_or_else(|| AdminError::not_found(format!("dead letter {sequence_number} of {queue}")))?;
        let headers_ = properties(col(&r, 12)?);
        let description = text_col(&r, 10)?;
        let body: Vec<u8> = col(&r, 13)?;
        Ok(DeadLetter {
            queue: queue.to_owned(),
            sequence_number: col(&r, 0)?,
            message_id: text_col(&r, 1)?.unwrap_or_default(),
            message_type: text_col(&r, 2)?,
            correlation_id: text_col(&r, 3)?,
            causation_id: text_col(&r, 4)?,
            content_type: text_col(&r, 5)?,
            session_id: text_col(&r, 6)?,
            enqueued_at: from_micros(col(&r, 7)?),
            delivery_count: delivery_count(col(&r, 8)?),
            reason: text_col(&r, 9)?,
            source: text_col(&r, 11)?,
            error: failure_text(&headers_, description.as_deref()),
            error_chain: failure_chain(&headers_, description.as_deref()),
            description,
            headers: crate::admin::model::without_seals(headers_),
            body_size: body.len(),
            body: BodyView::decode(&body),
            resubmit_refused: None,
        })
    }

    async fn resubmit(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let broker = self.queue_for_change(queue).await?;
        let moved = broker.resubmit_dead_letters(queue, &[sequence_number]).await?;
        if let Some((_, why)) = moved.refused.into_iter().next() {
            return Err(AdminError::refused(format!(
                "dead letter {sequence_number} of {queue} cannot go back: {why}"
            )));
        }
        if moved.done.is_empty() {
            return Err(AdminError::not_found(format!(
                "dead letter {sequence_number} of {queue}"
            )));
        }
        Ok(())
    }

    /// Moves up to 1000 messages per transaction, inside the database (the bodies are
    /// not read out): each message moves or stays as a whole, and a batch costs about
    /// what one send of as many messages costs.
    async fn resubmit_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        let broker = self.queue_for_change(queue).await?;
        in_batches(sequence_numbers, |batch| broker.resubmit_dead_letters(queue, batch)).await
    }

    /// One query, not a page at a time.
    async fn all_dead_letters(&self, queue: &str) -> AdminResult<Vec<SequenceNumber>> {
        let (entity, _) = self.entity(queue).await?;
        sqlx::query_scalar("SELECT seq FROM courier_message WHERE entity_id = ?1 AND state = 3 ORDER BY seq")
            .bind(entity)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot list dead letters", e))
    }

    /// Deletes up to 1000 messages per transaction.
    async fn delete_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        let broker = self.queue_for_change(queue).await?;
        in_batches(sequence_numbers, |batch| async move {
            Ok(Moved {
                done: broker.delete_dead_letters(queue, batch).await?,
                refused: Vec::new(),
            })
        })
        .await
    }

    async fn delete_dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let broker = self.queue_for_change(queue).await?;
        if broker.delete_dead_letter(queue, sequence_number).await? {
            Ok(())
        } else {
            Err(AdminError::not_found(format!(
                "dead letter {sequence_number} of {queue}"
            )))
        }
    }
}

/// How many dead letters one transaction moves or deletes (the engine serves nothing
/// else while it runs one: a bound on how long a batch holds the writer).
const BATCH: usize = 1000;

/// Runs `step` on `seqs` in batches of [`BATCH`] (each one transaction) and reports each
/// sequence number: moved, not there, refused (with why) or failed with its batch (still
/// in the dead-letter sub-queue).
async fn in_batches<'a, F, Fut>(seqs: &'a [SequenceNumber], step: F) -> AdminResult<BatchOutcome>
where
    F: Fn(&'a [SequenceNumber]) -> Fut,
    Fut: std::future::Future<Output = AdminResult<Moved>>,
{
    let mut outcome = BatchOutcome::default();
    for batch in seqs.chunks(BATCH) {
        match step(batch).await {
            Ok(Moved { done, refused }) => {
                outcome.not_found.extend(
                    batch
                        .iter()
                        .filter(|s| done.binary_search(s).is_err() && !refused.iter().any(|(r, _)| r == *s)),
                );
                outcome.done.extend(done);
                outcome.failed.extend(refused);
            }
            Err(e @ (AdminError::Refused { .. } | AdminError::Unavailable { .. } | AdminError::NotFound { .. })) => {
                return Err(e);
            }
            Err(e) => {
                let why = e.to_string();
                outcome.failed.extend(batch.iter().map(|s| (*s, why.clone())));
            }
        }
    }
    Ok(outcome)
}

#[async_trait]
impl StoreAdmin for EmbeddedAdmin {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    async fn saga_types(&self) -> AdminResult<Vec<SagaTypeSummary>> {
        sqlite::saga_types(&self.pool).await
    }

    async fn sagas(&self, saga_type: &str, filter: &SagaFilter) -> AdminResult<Vec<SagaSummary>> {
        sqlite::sagas(&self.pool, saga_type, filter).await
    }

    async fn saga(&self, saga_type: &str, correlation: &str) -> AdminResult<SagaInstance> {
        sqlite::saga(&self.pool, saga_type, correlation).await
    }

    async fn complete_saga(&self, saga_type: &str, correlation: &str, reason: &str) -> AdminResult<CompletedSaga> {
        check_reason(reason)?;
        let done = self.writer()?.complete_saga_by_hand(saga_type, correlation).await?;
        log_completed(&self.name, saga_type, correlation, &done, reason);
        Ok(done)
    }

    async fn timeouts(&self, filter: &TimeoutFilter) -> AdminResult<Vec<PendingTimeout>> {
        sqlite::timeouts(&self.pool, filter, self.clock.now()).await
    }

    async fn outbox(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        sqlite::outbox(&self.pool, limit).await
    }

    async fn outbox_dead_letters(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        sqlite::outbox_dead_letters(&self.pool, limit).await
    }
}
