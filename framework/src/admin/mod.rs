//! Operations: look at and repair what a running system holds, without writing code.
//!
//! Two small capabilities, so each tool asks only for what it needs:
//!
//! - [`QueueAdmin`], for a broker: queues with their counts, and the dead letters of a
//!   queue (list, show, resubmit to the queue they came from, delete);
//! - [`StoreAdmin`], for a store: saga instances (list, show, complete by hand), pending
//!   and overdue timeouts, and the outbox (rows not dispatched, and its dead letters);
//! - [`HistoryAdmin`], for a store that keeps a workflow's history: a saga instance's
//!   timeline and the tree of messages a message caused (`history.rs`).
//!
//! Implemented for the embedded broker's file ([`EmbeddedAdmin`], all three), the Postgres
//! database ([`PostgresAdmin`], all three: the store's tables and the Postgres transport's
//! queues, `pg_queues.rs`), the SQLite store ([`SqliteAdmin`], `StoreAdmin` and
//! `HistoryAdmin`) and RabbitMQ (`AmqpAdmin`, `QueueAdmin`, feature `amqp`, in
//! `crate::amqp::admin`). The `courier` command line is a thin layer over these traits;
//! `docs/operations.md` is the runbook.
//!
//! Every change is atomic per message where the broker can promise it: a resubmit moves
//! one dead letter back to its queue in one transaction (same message id, so an inbox
//! still recognises it; the delivery count and the retry headers start again), so an
//! interrupted resubmit of many leaves each message either in the dead-letter queue or
//! back in its queue. On the embedded broker and on Postgres it is a transaction (on
//! Postgres, one `UPDATE` of the message's row). On RabbitMQ, `AmqpAdmin` first parks a
//! queue's dead letters in the transport's schedule store (insert, commit, then
//! acknowledge: never lost, never twice), and a resubmit publishes confirmed copies, then
//! deletes their rows: a publish and a database delete cannot be one transaction, so an
//! interruption between the two leaves a message in both (same message id), never in
//! neither (see `AmqpAdmin`).
//!
//! # Examples
//!
//! ```
//! use courier::admin::{EmbeddedAdmin, QueueAdmin};
//! use courier::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = Embedded::in_memory().await?;
//! broker.create_queue("orders", &QueueOptions::default()).await?;
//! let admin = EmbeddedAdmin::new(broker.clone());
//! let queues = admin.queues().await?;
//! assert_eq!(queues[0].name, "orders");
//! assert_eq!(queues[0].dead_lettered, 0);
//! # Ok(()) }
//! ```

// Without a store feature, the helpers the implementations share have no user.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

mod error;
mod history;
mod history_read;
pub(crate) mod model;

#[cfg(feature = "sqlite")]
mod embedded;
#[cfg(feature = "postgres")]
mod pg_history;
#[cfg(feature = "postgres")]
mod pg_queues;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "sqlite")]
mod sqlite_history;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

pub use self::error::{AdminError, AdminResult};
pub use self::history::{
    FoundHistory, FoundInstance, HistoryAdmin, HistoryFilter, MAX_HISTORY_DEPTH, MAX_HISTORY_EVENTS, MessageHistory,
    MessageNode, SagaHistory, StoredHistoryEvent, TimelineLink,
};
pub use self::model::{
    BatchOutcome, BodyView, CompletedSaga, DeadLetter, DeadLetterSummary, EntityKind, OutboxEntry, Page,
    PendingTimeout, QueueSummary, SagaFilter, SagaInstance, SagaSummary, SagaTypeSummary, TimeoutFilter, TimeoutState,
};
#[cfg(feature = "amqp")]
pub use crate::amqp::AmqpAdmin;
#[cfg(feature = "sqlite")]
pub use embedded::EmbeddedAdmin;
#[cfg(feature = "postgres")]
pub use postgres::PostgresAdmin;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteAdmin;
#[cfg(feature = "sqlite")]
pub(crate) use sqlite::complete as sqlite_complete;

use crate::logtext::Escaped;
use crate::message::SequenceNumber;

/// The most items one page or list returns.
pub const MAX_PAGE: u32 = 1000;

/// A broker's queues and their dead letters.
///
/// # Cancel safety
///
/// Each change is one transaction per message: a future dropped half way through
/// [`resubmit_many`](Self::resubmit_many) leaves every message either in the dead-letter
/// sub-queue or back in its queue, never both, never neither. (On RabbitMQ, never neither,
/// but possibly both: see `AmqpAdmin`.)
#[async_trait]
pub trait QueueAdmin: Send + Sync {
    /// What this is connected to, for messages and logs (never with a password).
    fn describe(&self) -> String;

    /// The broker's time (ages are measured from it).
    fn now(&self) -> DateTime<Utc>;

    /// Every queue, topic and subscription with its counts, by name.
    ///
    /// # Errors
    /// [`AdminError::Failed`] if the broker cannot be read.
    async fn queues(&self) -> AdminResult<Vec<QueueSummary>>;

    /// A page of the dead letters of `queue` (a queue, or `topic/subscriptions/name`),
    /// in sequence order, starting after sequence number `after` (0 for the first page);
    /// at most `limit` ([`MAX_PAGE`] at most).
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if there is no such queue.
    async fn dead_letters(
        &self,
        queue: &str,
        after: SequenceNumber,
        limit: u32,
    ) -> AdminResult<Page<DeadLetterSummary>>;

    /// One dead letter in full: headers, reason, description, the failure the endpoint
    /// wrote, delivery count, and the body.
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if the queue or the message is not there.
    async fn dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<DeadLetter>;

    /// Moves one dead letter back to the queue it came from, in one transaction: same
    /// message id and body and headers, without the failure and retry headers, the
    /// delivery count at zero, its time-to-live counted from now. Whether it keeps its
    /// sequence number depends on the broker: the embedded broker puts it back in place
    /// (received before the messages sent after it failed, as an abandoned message is);
    /// the others enqueue it anew.
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if it is not there (already moved or deleted, or locked
    /// by a receiver of the dead-letter sub-queue); [`AdminError::Refused`] when this
    /// admin cannot write (see the implementation).
    async fn resubmit(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()>;

    /// The dead letters among `sequence_numbers` as a listing shows them, in the order
    /// given, and the numbers not found: what a dry run prints. On RabbitMQ, one reading
    /// of the dead-letter queue for all of them.
    ///
    /// # Errors
    /// As [`dead_letter`](Self::dead_letter), but a number not found is reported, not an
    /// error.
    async fn dead_letter_summaries(
        &self,
        queue: &str,
        sequence_numbers: &[SequenceNumber],
    ) -> AdminResult<(Vec<DeadLetterSummary>, Vec<SequenceNumber>)> {
        let mut found = Vec::new();
        let mut missing = Vec::new();
        for &seq in sequence_numbers {
            match self.dead_letter(queue, seq).await {
                Ok(d) => found.push(d.summary()),
                Err(AdminError::NotFound { .. }) => missing.push(seq),
                Err(e) => return Err(e),
            }
        }
        Ok((found, missing))
    }

    /// Deletes one dead letter for good.
    ///
    /// # Errors
    /// As [`resubmit`](Self::resubmit).
    async fn delete_dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()>;

    /// Resubmits several dead letters, one transaction each; reports each.
    ///
    /// # Errors
    /// Only when nothing can be done at all (the queue does not exist, a refused write,
    /// an unreachable broker); one message's failure is reported in the outcome.
    async fn resubmit_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        let mut outcome = BatchOutcome::default();
        for &seq in sequence_numbers {
            match self.resubmit(queue, seq).await {
                Ok(()) => outcome.done.push(seq),
                Err(AdminError::NotFound { .. }) => outcome.not_found.push(seq),
                Err(e @ (AdminError::Refused { .. } | AdminError::Unavailable { .. })) => return Err(e),
                Err(e) => outcome.failed.push((seq, e.to_string())),
            }
        }
        Ok(outcome)
    }

    /// Deletes several dead letters, one transaction each; reports each.
    ///
    /// # Errors
    /// As [`resubmit_many`](Self::resubmit_many).
    async fn delete_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        let mut outcome = BatchOutcome::default();
        for &seq in sequence_numbers {
            match self.delete_dead_letter(queue, seq).await {
                Ok(()) => outcome.done.push(seq),
                Err(AdminError::NotFound { .. }) => outcome.not_found.push(seq),
                Err(e @ (AdminError::Refused { .. } | AdminError::Unavailable { .. })) => return Err(e),
                Err(e) => outcome.failed.push((seq, e.to_string())),
            }
        }
        Ok(outcome)
    }

    /// The sequence numbers of every dead letter of `queue` now: what "all" means for
    /// [`resubmit_many`](Self::resubmit_many) and [`delete_many`](Self::delete_many), so a
    /// message that fails again and comes back to the dead-letter queue meanwhile is not
    /// taken a second time.
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    async fn all_dead_letters(&self, queue: &str) -> AdminResult<Vec<SequenceNumber>> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let page = self.dead_letters(queue, after, MAX_PAGE).await?;
            all.extend(page.items.iter().map(|d| d.sequence_number));
            match page.next_after {
                Some(next) => after = next,
                None => return Ok(all),
            }
        }
    }
}

/// A store's sagas, timeouts and outbox.
#[async_trait]
pub trait StoreAdmin: Send + Sync {
    /// What this is connected to, for messages and logs (never with a password).
    fn describe(&self) -> String;

    /// The time ages and overdue timeouts are measured from.
    fn now(&self) -> DateTime<Utc>;

    /// The saga types that have instances, with how many.
    ///
    /// # Errors
    /// [`AdminError::Failed`] if the store cannot be read.
    async fn saga_types(&self) -> AdminResult<Vec<SagaTypeSummary>>;

    /// Instances of the saga `saga_type` that pass `filter`, least recently updated first.
    ///
    /// # Errors
    /// [`AdminError::Failed`] if the store cannot be read.
    async fn sagas(&self, saga_type: &str, filter: &SagaFilter) -> AdminResult<Vec<SagaSummary>>;

    /// One instance: its state as JSON, version and pending timeouts.
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if there is no such instance (it may have completed).
    async fn saga(&self, saga_type: &str, correlation: &str) -> AdminResult<SagaInstance>;

    /// Completes (deletes) one instance by hand, with its pending timeouts and
    /// correlation properties, in one transaction; `reason` is logged (a `tracing`
    /// warning with the saga, the correlation and the version). A message for it that
    /// comes later finds no instance (it starts a new one only if it is a start message).
    ///
    /// # Errors
    /// [`AdminError::NotFound`] if there is no such instance; [`AdminError::Refused`] if
    /// `reason` is empty or this admin cannot write.
    async fn complete_saga(&self, saga_type: &str, correlation: &str, reason: &str) -> AdminResult<CompletedSaga>;

    /// Pending timeouts (not handled yet), earliest due first; with
    /// [`TimeoutFilter::overdue`], only the overdue ones.
    ///
    /// # Errors
    /// [`AdminError::Failed`] if the store cannot be read.
    async fn timeouts(&self, filter: &TimeoutFilter) -> AdminResult<Vec<PendingTimeout>>;

    /// Messages stored in the outbox and not dispatched yet, oldest first.
    ///
    /// # Errors
    /// [`AdminError::Failed`] if the store cannot be read.
    async fn outbox(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>>;

    /// Outbox messages the transport refused for good at dispatch, oldest first.
    ///
    /// # Errors
    /// [`AdminError::Failed`] if the store cannot be read.
    async fn outbox_dead_letters(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>>;
}

/// Logs the completion of a saga by hand (every store does the same).
impl DeadLetter {
    /// What a listing shows of it.
    #[must_use]
    pub fn summary(&self) -> DeadLetterSummary {
        DeadLetterSummary {
            sequence_number: self.sequence_number,
            message_id: self.message_id.clone(),
            message_type: self.message_type.clone(),
            enqueued_at: self.enqueued_at,
            delivery_count: self.delivery_count,
            reason: self.reason.clone(),
            error: self.error.clone().or_else(|| self.description.clone()),
            resubmit_refused: self.resubmit_refused.clone(),
        }
    }
}

pub(crate) fn log_completed(store: &str, saga_type: &str, correlation: &str, done: &CompletedSaga, reason: &str) {
    tracing::warn!(
        store,
        saga_type = %Escaped(saga_type),
        correlation = %Escaped(correlation),
        version = done.version,
        timeouts_removed = done.timeouts_removed,
        reason = %Escaped(reason),
        "saga instance completed by hand"
    );
}

/// Refuses an empty reason.
pub(crate) fn check_reason(reason: &str) -> AdminResult<()> {
    if reason.trim().is_empty() {
        return Err(AdminError::refused(
            "completing a saga by hand needs a reason (it is logged): say why",
        ));
    }
    Ok(())
}

/// Bounds a requested page size.
pub(crate) fn page_size(limit: u32) -> i64 {
    i64::from(limit.clamp(1, MAX_PAGE))
}

/// A connection URL as it may be shown: without its password (`postgres://u:***@h/db`).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The authority ends at the first '/', '?' or '#'; its user info at its last '@'.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info.split_once(':').map_or(user_info, |(u, _)| u);
            let hidden = if user_info.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db.example:5432/orders?sslmode=require"),
            "postgres://app:***@db.example:5432/orders?sslmode=require"
        );
        assert_eq!(
            redact_url("amqp://guest:p@ss:w@rd@rabbit:5672/%2f"),
            "amqp://guest:***@rabbit:5672/%2f"
        );
        assert_eq!(redact_url("postgres://app@db/orders"), "postgres://app@db/orders");
        assert_eq!(redact_url("postgres://db/orders"), "postgres://db/orders");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn bodies_are_shown_as_json_text_or_bytes() {
        assert_eq!(
            BodyView::decode(br#"{"id":7}"#),
            BodyView::Json(serde_json::json!({"id": 7}))
        );
        assert_eq!(BodyView::decode(b"<script>"), BodyView::Text("<script>".into()));
        assert_eq!(BodyView::decode(&[0xff, 0x00]), BodyView::Bytes(vec![0xff, 0x00]));
    }
}
