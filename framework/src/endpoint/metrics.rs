//! The metrics an endpoint emits through the [`metrics`] facade: the
//! application installs a recorder (Prometheus, OpenTelemetry, StatsD...) and sees them;
//! without one every call is a no-op. Names follow OpenTelemetry's messaging semantic
//! conventions where one exists (`messaging.*`) and are Courier's own (`courier.*`) for
//! the rest; docs/observability.md lists each with its unit and labels.
//!
//! Label values are bounded: an endpoint or queue name, a transport name, a message type
//! from the endpoint's registry of known types (`unknown` for anything else), a saga type,
//! a dead-letter reason constant, an error kind. Never a message id or correlation value.
//!
//! Handles are registered when an endpoint starts, with the recorder installed then:
//! install the recorder before starting endpoints.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::metrics::{Counter, Histogram, Label, SharedString, counter, histogram};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::clock::Clock;
use crate::endpoint::Failure;
use crate::loglimit::{Level, LogLimiter};
use crate::message::{Envelope, ReceivedMessage, SequenceNumber};
use crate::transport::Sender;

/// The names of the metrics Courier emits (see docs/observability.md).
pub mod names {
    /// Messages delivered to the endpoint (counter, `{message}`). OpenTelemetry.
    pub const CONSUMED: &str = "messaging.client.consumed.messages";
    /// How long the handlers of one delivery ran, commit included (histogram, seconds).
    /// OpenTelemetry.
    pub const PROCESS_DURATION: &str = "messaging.process.duration";
    /// Messages sent or published through a transport (counter, `{message}`).
    /// OpenTelemetry.
    pub const SENT: &str = "messaging.client.sent.messages";
    /// How long a send (or a batch) took until the broker accepted it (histogram,
    /// seconds). OpenTelemetry.
    pub const OPERATION_DURATION: &str = "messaging.client.operation.duration";
    /// Messages handled and completed (counter).
    pub const HANDLED: &str = "courier.messages.handled";
    /// Failed handling attempts (counter), by `error.type`.
    pub const FAILED: &str = "courier.messages.failed";
    /// Failed attempts retried (counter), by `courier.retry.kind` (`immediate`, `delayed`).
    pub const RETRIED: &str = "courier.messages.retried";
    /// Messages dead-lettered (counter), by `courier.dead_letter.reason`.
    pub const DEAD_LETTERED: &str = "courier.messages.dead_lettered";
    /// Messages found in the inbox (processed before) and completed without handling.
    pub const DEDUPLICATED: &str = "courier.messages.deduplicated";
    /// Completion time minus the broker's enqueued time (histogram, seconds).
    pub const END_TO_END: &str = "courier.message.end_to_end.duration";
    /// Saga instances started (counter).
    pub const SAGAS_STARTED: &str = "courier.sagas.started";
    /// Saga instances completed (counter).
    pub const SAGAS_COMPLETED: &str = "courier.sagas.completed";
    /// Saga saves that found the instance changed by another process (counter).
    pub const SAGA_CONFLICTS: &str = "courier.sagas.conflicts";
    /// Messages that found no saga instance and did not start one (counter).
    pub const SAGAS_NOT_FOUND: &str = "courier.sagas.not_found";
    /// Saga timeouts requested (counter).
    pub const TIMEOUTS_REQUESTED: &str = "courier.timeouts.requested";
    /// Saga timeouts cancelled (counter).
    pub const TIMEOUTS_CANCELLED: &str = "courier.timeouts.cancelled";
    /// Saga timeouts handled by their saga (counter).
    pub const TIMEOUTS_FIRED: &str = "courier.timeouts.fired";
    /// Saga timeouts whose message was dead-lettered (counter).
    pub const TIMEOUTS_DEAD_LETTERED: &str = "courier.timeouts.dead_lettered";
    /// When a timeout was handled minus when it was due (histogram, seconds).
    pub const TIMEOUT_LATENESS: &str = "courier.timeouts.lateness";
    /// Outbox messages the transport refused for good, set aside (counter).
    pub const OUTBOX_DEAD_LETTERED: &str = "courier.outbox.dead_lettered";
    /// Inbox records purged after their retention (counter).
    pub const INBOX_PURGED: &str = "courier.inbox.purged";
    /// Active messages in the endpoint's input queue, sampled (gauge).
    pub const QUEUE_DEPTH: &str = "courier.queue.depth";
    /// Scheduled messages in the endpoint's input queue, sampled (gauge).
    pub const QUEUE_SCHEDULED: &str = "courier.queue.scheduled";
    /// Messages in the input queue's dead-letter sub-queue, sampled (gauge).
    pub const QUEUE_DEAD_LETTERED: &str = "courier.queue.dead_lettered";
    /// Outbox rows of the endpoint not yet dispatched, sampled (gauge).
    pub const OUTBOX_BACKLOG: &str = "courier.outbox.backlog";
    /// How long the oldest of them has waited, sampled (gauge, seconds; 0 when none).
    pub const OUTBOX_OLDEST_AGE: &str = "courier.outbox.oldest_age";
    /// Inbox records of the endpoint, sampled (gauge).
    pub const INBOX_ROWS: &str = "courier.inbox.rows";
    /// Connections re-established to the broker after a drop (counter).
    pub const RECONNECTS: &str = "courier.transport.reconnects";
}

/// The label keys.
pub mod labels {
    /// The transport ([`Transport::name`](crate::Transport::name)). OpenTelemetry.
    pub const SYSTEM: &str = "messaging.system";
    /// The endpoint's input queue, or the queue or topic sent to. OpenTelemetry.
    pub const DESTINATION: &str = "messaging.destination.name";
    /// `receive`, `process` or `send`. OpenTelemetry.
    pub const OPERATION: &str = "messaging.operation.name";
    /// What failed, on failures only. OpenTelemetry.
    pub const ERROR_TYPE: &str = "error.type";
    /// The message type, one the endpoint knows, or `unknown`.
    pub const MESSAGE_TYPE: &str = "courier.message.type";
    /// `immediate` or `delayed`.
    pub const RETRY_KIND: &str = "courier.retry.kind";
    /// The dead-letter reason (a `courier.*` reason constant).
    pub const REASON: &str = "courier.dead_letter.reason";
    /// The saga type.
    pub const SAGA_TYPE: &str = "courier.saga.type";
}

/// The label value of a message type the endpoint does not know.
pub const UNKNOWN_TYPE: &str = "unknown";

/// How long, by the component's clock, the dead-letterings of one queue and reason are
/// only counted after the first was logged in full: each such window ends with one
/// summary line (see `loglimit.rs`).
pub(crate) const DEAD_LETTER_LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts `n` messages of `queue` that a transport dead-lettered itself (a refusal of the
/// wire format, an expired time-to-live, the max delivery count) with `reason` in
/// `courier.messages.dead_lettered`, labelled with the transport (`system`) and the queue
/// (its entity path). An endpoint's own dead-letterings are counted per message type
/// ([`TypeMetrics::dead_lettered`]), never here: each dead-lettering is counted once.
pub(crate) fn count_dead_lettered(system: &'static str, queue: &str, reason: &str, n: u64) {
    if n == 0 {
        return;
    }
    counter!(
        names::DEAD_LETTERED,
        labels::SYSTEM => system,
        labels::DESTINATION => queue.to_owned(),
        labels::REASON => reason.to_owned()
    )
    .increment(n);
}

/// The log limiter of a transport's own dead-letterings (`WARN` summaries).
pub(crate) fn transport_dead_letter_log(clock: Arc<dyn Clock>) -> LogLimiter {
    LogLimiter::new(
        clock,
        DEAD_LETTER_LOG_EVERY,
        Level::Warn,
        "messages dead-lettered by the transport",
    )
}

/// The handles of one message type at one endpoint.
pub(crate) struct TypeMetrics {
    base: Vec<Label>,
    consumed: Counter,
    handled: Counter,
    deduplicated: Counter,
    retried_immediate: Counter,
    retried_delayed: Counter,
    process_duration: Histogram,
    end_to_end: Histogram,
}

impl TypeMetrics {
    fn new(system: &SharedString, endpoint: &SharedString, message_type: SharedString) -> Self {
        let base = vec![
            Label::new(labels::SYSTEM, system.clone()),
            Label::new(labels::DESTINATION, endpoint.clone()),
            Label::new(labels::MESSAGE_TYPE, message_type),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut l = base.clone();
            l.extend(extra.iter().map(|(k, v)| Label::new(*k, *v)));
            l
        };
        Self {
            consumed: counter!(names::CONSUMED, with(&[(labels::OPERATION, "receive")])),
            handled: counter!(names::HANDLED, base.clone()),
            deduplicated: counter!(names::DEDUPLICATED, base.clone()),
            retried_immediate: counter!(names::RETRIED, with(&[(labels::RETRY_KIND, "immediate")])),
            retried_delayed: counter!(names::RETRIED, with(&[(labels::RETRY_KIND, "delayed")])),
            process_duration: histogram!(names::PROCESS_DURATION, with(&[(labels::OPERATION, "process")])),
            end_to_end: histogram!(names::END_TO_END, base.clone()),
            base,
        }
    }

    fn labels_with(&self, extra: [Label; 1]) -> Vec<Label> {
        let mut l = self.base.clone();
        l.extend(extra);
        l
    }

    /// A delivery arrived.
    pub(crate) fn consumed(&self) {
        self.consumed.increment(1);
    }

    /// The handling of a delivery ended after `elapsed`; `failure` tells what failed, if
    /// it did.
    pub(crate) fn processed(&self, elapsed: Duration, failure: Option<&Failure>) {
        match failure {
            None => self.process_duration.record(elapsed.as_secs_f64()),
            Some(f) => {
                let l = self.labels_with([Label::new(labels::ERROR_TYPE, error_type(f))]);
                let mut l = l;
                l.push(Label::new(labels::OPERATION, "process"));
                histogram!(names::PROCESS_DURATION, l).record(elapsed.as_secs_f64());
            }
        }
    }

    /// An attempt failed.
    pub(crate) fn failed(&self, failure: &Failure) {
        let l = self.labels_with([Label::new(labels::ERROR_TYPE, error_type(failure))]);
        counter!(names::FAILED, l).increment(1);
    }

    /// A message enqueued at `enqueued` was completed after its handling at `now`.
    pub(crate) fn handled(&self, enqueued: DateTime<Utc>, now: DateTime<Utc>) {
        self.handled.increment(1);
        self.end_to_end.record(seconds_between(enqueued, now));
    }

    /// A message was found in the inbox and completed without handling.
    pub(crate) fn deduplicated(&self) {
        self.deduplicated.increment(1);
    }

    /// A failed attempt will be retried.
    pub(crate) fn retried(&self, delayed: bool) {
        if delayed {
            self.retried_delayed.increment(1);
        } else {
            self.retried_immediate.increment(1);
        }
    }

    /// A message was dead-lettered with `reason` (one of the `reasons` constants).
    pub(crate) fn dead_lettered(&self, reason: &'static str) {
        let l = self.labels_with([Label::new(labels::REASON, reason)]);
        counter!(names::DEAD_LETTERED, l).increment(1);
    }
}

/// An endpoint's metrics.
pub(crate) struct EndpointMetrics {
    system: SharedString,
    endpoint: SharedString,
    known: HashMap<String, TypeMetrics>,
    unknown: TypeMetrics,
    outbox_dead_lettered: Counter,
    inbox_purged: Counter,
    timeouts_dead_lettered: Counter,
    /// Which dead-letterings are logged in full (see `loglimit.rs`).
    dead_letter_log: LogLimiter,
}

impl EndpointMetrics {
    /// Registers the handles of `endpoint` on `system` for each of `types`: (a wire name
    /// the endpoint handles, the type's name); its dead-letterings are logged by `clock`.
    pub(crate) fn new<'a>(
        system: &'static str,
        endpoint: &str,
        types: impl IntoIterator<Item = (&'a str, &'static str)>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let system = SharedString::from(system);
        let endpoint = SharedString::from(endpoint.to_owned());
        let known = types
            .into_iter()
            .map(|(wire, name)| (wire.to_owned(), TypeMetrics::new(&system, &endpoint, name.into())))
            .collect();
        let unknown = TypeMetrics::new(&system, &endpoint, UNKNOWN_TYPE.into());
        let endpoint_labels = vec![
            Label::new(labels::SYSTEM, system.clone()),
            Label::new(labels::DESTINATION, endpoint.clone()),
        ];
        Self {
            outbox_dead_lettered: counter!(names::OUTBOX_DEAD_LETTERED, endpoint_labels.clone()),
            inbox_purged: counter!(names::INBOX_PURGED, endpoint_labels.clone()),
            timeouts_dead_lettered: counter!(names::TIMEOUTS_DEAD_LETTERED, endpoint_labels),
            dead_letter_log: LogLimiter::new(clock, DEAD_LETTER_LOG_EVERY, Level::Error, "messages dead-lettered"),
            system,
            endpoint,
            known,
            unknown,
        }
    }

    /// The handles of the message's type (`unknown` when the endpoint does not know it).
    pub(crate) fn of(&self, message: &ReceivedMessage) -> &TypeMetrics {
        message
            .envelope
            .message_type
            .as_deref()
            .and_then(|t| self.known.get(t))
            .unwrap_or(&self.unknown)
    }

    /// The store sent these messages (their destinations) in the handling's transaction,
    /// not through a sender.
    pub(crate) fn sent_at_commit(&self, destinations: &[String]) {
        for d in destinations {
            let l = [
                Label::new(labels::SYSTEM, self.system.clone()),
                Label::new(labels::DESTINATION, d.clone()),
                Label::new(labels::OPERATION, "send"),
            ];
            counter!(names::SENT, l.to_vec()).increment(1);
        }
    }

    /// The endpoint dead-lettered the message `message_id` with `reason`: `true` when it
    /// is logged in full (the first of its reason in a while), `false` when it is only
    /// counted in the next summary line of the endpoint's queue and the reason.
    pub(crate) fn log_dead_letter(&self, reason: &str, message_id: &str) -> bool {
        self.dead_letter_log
            .admit(&self.endpoint, reason, 1, message_id, message_id)
    }

    /// A timeout's message was dead-lettered.
    pub(crate) fn timeout_dead_lettered(&self) {
        self.timeouts_dead_lettered.increment(1);
    }

    /// Outbox messages set aside.
    pub(crate) fn outbox_dead_lettered(&self) {
        self.outbox_dead_lettered.increment(1);
    }

    /// Inbox records purged.
    pub(crate) fn inbox_purged(&self, n: u64) {
        self.inbox_purged.increment(n);
    }

    /// What the saga handlers of one committed handling did.
    pub(crate) fn sagas(&self, tally: &[SagaTally]) {
        for t in tally {
            let l = self.saga_labels(t.saga);
            if t.started {
                counter!(names::SAGAS_STARTED, l.clone()).increment(1);
            }
            if t.completed {
                counter!(names::SAGAS_COMPLETED, l.clone()).increment(1);
            }
            if t.requested > 0 {
                counter!(names::TIMEOUTS_REQUESTED, l.clone()).increment(t.requested);
            }
            if t.cancelled > 0 {
                counter!(names::TIMEOUTS_CANCELLED, l.clone()).increment(t.cancelled);
            }
            if let Some(late) = t.fired_late {
                counter!(names::TIMEOUTS_FIRED, l.clone()).increment(1);
                histogram!(names::TIMEOUT_LATENESS, l).record(late);
            }
        }
    }

    fn saga_labels(&self, saga: &'static str) -> Vec<Label> {
        vec![
            Label::new(labels::DESTINATION, self.endpoint.clone()),
            Label::new(labels::SAGA_TYPE, saga),
        ]
    }
}

fn saga_labels(endpoint: &str, saga: &'static str) -> [Label; 2] {
    [
        Label::new(labels::DESTINATION, endpoint.to_owned()),
        Label::new(labels::SAGA_TYPE, saga),
    ]
}

/// A save of an instance of `saga` at `endpoint` found it changed by another process.
pub(crate) fn saga_conflict(endpoint: &str, saga: &'static str) {
    counter!(names::SAGA_CONFLICTS, saga_labels(endpoint, saga).to_vec()).increment(1);
}

/// A message at `endpoint` found no instance of `saga` and did not start one.
pub(crate) fn saga_not_found(endpoint: &str, saga: &'static str) {
    counter!(names::SAGAS_NOT_FOUND, saga_labels(endpoint, saga).to_vec()).increment(1);
}

/// What one saga handler did, counted once its handling committed.
#[derive(Debug, Clone, Default)]
pub(crate) struct SagaTally {
    pub(crate) saga: &'static str,
    pub(crate) started: bool,
    pub(crate) completed: bool,
    pub(crate) requested: u64,
    pub(crate) cancelled: u64,
    /// The message was a timeout of the instance, handled this late (seconds).
    pub(crate) fired_late: Option<f64>,
}

/// `to - from` in seconds, 0 when `to` is earlier.
pub(crate) fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).to_std().map_or(0.0, |d| d.as_secs_f64())
}

/// The `error.type` of a failure: a bounded set of kinds.
pub(crate) fn error_type(failure: &Failure) -> &'static str {
    match failure {
        Failure::Decode { .. } => "decode",
        Failure::Handler { .. } => "handler",
        Failure::Panic { .. } => "panic",
        Failure::Dispatch(_) => "dispatch",
        Failure::Undispatched { .. } => "undispatched",
        Failure::Store(_) => "store",
        Failure::Unfinished { .. } => "unfinished",
        Failure::SagaNotFound { .. } => "saga_not_found",
        Failure::Refused { .. } | Failure::RefusedAtCommit { .. } => "refused",
        Failure::Version { .. } => "version",
        Failure::TimeoutRefused { .. } => "timeout_refused",
        Failure::SagaRefused { .. } => "saga_refused",
    }
}

/// Counts a reconnection of `system` to its broker.
#[cfg(feature = "amqp")]
pub(crate) fn reconnected(system: &'static str) {
    counter!(names::RECONNECTS, labels::SYSTEM => system).increment(1);
}

/// A sender that counts and times what it sends.
pub(crate) struct MeteredSender {
    inner: Arc<dyn Sender>,
    labels: Vec<Label>,
    sent: Counter,
    duration: Histogram,
}

impl MeteredSender {
    /// Wraps `inner`, a sender of `system` to `destination`.
    pub(crate) fn wrap(inner: Arc<dyn Sender>, system: &'static str) -> Arc<dyn Sender> {
        let labels = vec![
            Label::new(labels::SYSTEM, system),
            Label::new(labels::DESTINATION, inner.entity().to_owned()),
            Label::new(labels::OPERATION, "send"),
        ];
        Arc::new(Self {
            sent: counter!(names::SENT, labels.clone()),
            duration: histogram!(names::OPERATION_DURATION, labels.clone()),
            labels,
            inner,
        })
    }

    fn record<T, E>(&self, started: Instant, count: usize, result: &Result<T, E>) {
        let elapsed = started.elapsed().as_secs_f64();
        let count = u64::try_from(count).unwrap_or(u64::MAX);
        match result {
            Ok(_) => {
                self.sent.increment(count);
                self.duration.record(elapsed);
            }
            Err(_) => {
                let mut l = self.labels.clone();
                l.push(Label::new(labels::ERROR_TYPE, "send"));
                counter!(names::SENT, l.clone()).increment(count);
                histogram!(names::OPERATION_DURATION, l).record(elapsed);
            }
        }
    }
}

#[async_trait]
impl Sender for MeteredSender {
    fn entity(&self) -> &str {
        self.inner.entity()
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    async fn send(&self, message: Envelope) -> Result<(), crate::transport::SendError> {
        let started = Instant::now();
        let result = self.inner.send(message).await;
        self.record(started, 1, &result);
        result
    }

    async fn send_batch(&self, messages: Vec<Envelope>) -> Result<(), crate::transport::SendError> {
        let (started, count) = (Instant::now(), messages.len());
        let result = self.inner.send_batch(messages).await;
        self.record(started, count, &result);
        result
    }

    async fn schedule(
        &self,
        message: Envelope,
        at: DateTime<Utc>,
    ) -> Result<SequenceNumber, crate::transport::SendError> {
        let started = Instant::now();
        let result = self.inner.schedule(message, at).await;
        self.record(started, 1, &result);
        result
    }

    async fn cancel_scheduled(&self, sequence_number: SequenceNumber) -> crate::error::Result<()> {
        self.inner.cancel_scheduled(sequence_number).await
    }

    async fn send_presettled(&self, message: Envelope) -> Result<(), crate::transport::SendError> {
        let started = Instant::now();
        let result = self.inner.send_presettled(message).await;
        self.record(started, 1, &result);
        result
    }
}
