//! Acting on a failed handling: the policy in `endpoint/recoverability.rs` decides
//! (immediate retry, delayed retry, dead letter); this file carries the decision out on
//! the delivery: abandon with the failure's headers, schedule the delayed copy and
//! complete, or dead-letter (also for messages that cannot be handled at all: no type, no
//! handler, no id).
//!
//! Holds `failure_properties`, `on_failure` and `dead_letter`. The retry policy and the
//! failure headers' names are not here: `endpoint/recoverability.rs`.

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};

use super::timeout_rows;
use crate::endpoint::Failure;
use crate::endpoint::history::{Attempt, Recorder};
use crate::endpoint::recoverability::{Decision, headers};
use crate::error::Error;
use crate::logtext::Escaped;
use crate::message::{Properties, PropertyValue};
use crate::store::history::{HistoryEvent, HistoryKind};
use crate::transport::{Delivery, Settlement};

use super::Shared;

pub(super) fn failure_properties(shared: &Shared, failure: &Failure, attempt: u32) -> Properties {
    let chain = failure.chain();
    let mut p = Properties::new();
    p.insert(
        headers::FAILURE_ERROR.to_owned(),
        PropertyValue::String(chain.first().cloned().unwrap_or_default()),
    );
    p.insert(
        headers::FAILURE_CHAIN.to_owned(),
        PropertyValue::String(chain.join("\n")),
    );
    if let Some(h) = failure.handler() {
        p.insert(headers::FAILURE_HANDLER.to_owned(), PropertyValue::String(h.to_owned()));
    }
    p.insert(
        headers::FAILURE_ENDPOINT.to_owned(),
        PropertyValue::String(shared.name.to_string()),
    );
    p.insert(
        headers::FAILURE_ATTEMPTS.to_owned(),
        PropertyValue::Int(i64::from(attempt)),
    );
    p.insert(
        headers::FAILURE_TIME.to_owned(),
        PropertyValue::String(shared.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
    );
    p.insert(
        headers::FAILURE_PERMANENT.to_owned(),
        PropertyValue::Bool(failure.permanent_reason().is_some()),
    );
    p
}

/// The failure headers of a message dead-lettered before any handler ran (no type, no
/// handler, no id): the description is its error; the attempts are its deliveries.
fn plain_failure(shared: &Shared, description: &str, deliveries: u32) -> Properties {
    let mut p = Properties::new();
    for key in [headers::FAILURE_ERROR, headers::FAILURE_CHAIN] {
        p.insert(key.to_owned(), PropertyValue::String(description.to_owned()));
    }
    p.insert(
        headers::FAILURE_ENDPOINT.to_owned(),
        PropertyValue::String(shared.name.to_string()),
    );
    p.insert(
        headers::FAILURE_ATTEMPTS.to_owned(),
        PropertyValue::Int(i64::from(deliveries)),
    );
    p.insert(
        headers::FAILURE_TIME.to_owned(),
        PropertyValue::String(shared.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
    );
    p.insert(headers::FAILURE_PERMANENT.to_owned(), PropertyValue::Bool(true));
    p
}

/// The attempt a failure, a dead letter or a duplicate ends.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tried {
    /// The delayed retries before it.
    pub(super) delayed: u32,
    /// Its number, counting immediate and delayed retries (as [`Context::attempt`]
    /// does; 1 on the first).
    ///
    /// [`Context::attempt`]: crate::Context::attempt
    pub(super) number: u32,
    /// When the endpoint began it (took the delivery up, by its clock).
    pub(super) began: DateTime<Utc>,
}

/// Writes an event of the history on its own (the attempt `tried` it describes rolled
/// back, or handled nothing), when the endpoint keeps one; a failure to write it is
/// logged and never changes how the message is settled.
pub(super) async fn record_history(
    shared: &Shared,
    tried: Tried,
    event: impl FnOnce(&Recorder, Attempt) -> HistoryEvent,
) {
    let (Some(recorder), Some(store)) = (&shared.history, &shared.store) else {
        return;
    };
    let attempt = Attempt {
        number: tried.number,
        received_at: Some(tried.began),
        at: shared.clock.now(),
    };
    let event = event(recorder, attempt);
    if let Err(e) = store.record_history(&event).await {
        tracing::warn!(error = %e, kind = %event.kind, "could not record this attempt in the endpoint's history");
    }
}

pub(super) async fn on_failure(shared: &Shared, delivery: Delivery, failure: Failure, tried: Tried) {
    let (delayed, attempt) = (tried.delayed, tried.number);
    let properties = failure_properties(shared, &failure, attempt);
    let error_text = failure.chain().join(": ");
    let metrics = shared.metrics.of(delivery.message());
    metrics.failed(&failure);
    if let Some(reason) = failure.permanent_reason() {
        dead_letter(shared, delivery, reason, error_text, properties, tried).await;
        return;
    }
    let delivery_count = delivery.message().broker.delivery_count;
    match shared.policy.decide(delayed, delivery_count) {
        Decision::Immediate => {
            shared.stats.retried.fetch_add(1, Ordering::Relaxed);
            metrics.retried(false);
            tracing::warn!(error = %Escaped(&error_text), handler = failure.handler(), "handler failed; immediate retry");
            record_history(shared, tried, |r, a| {
                r.failed(delivery.message(), a, HistoryKind::Retried, error_text.clone(), None)
            })
            .await;
            if let Err(e) = delivery.abandon_with(properties).await {
                tracing::warn!(error = %e, "abandon failed; the lock will expire and the message come back");
            }
        }
        Decision::Delayed { n, delay } => {
            let mut copy = delivery.message().envelope.clone();
            copy.properties.extend(properties);
            // The count, sealed with the endpoint's secret when it has one (trusted as it
            // is otherwise).
            match &shared.seal {
                Some(seal) => seal.write(&mut copy.properties, &shared.name, &copy.message_id, n),
                None => {
                    copy.properties
                        .insert(headers::DELAYED_RETRIES.to_owned(), PropertyValue::Int(i64::from(n)));
                    copy.properties.remove(headers::DELAYED_RETRY_SEAL);
                }
            }
            let at = shared.clock.now() + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
            copy.scheduled_enqueue_time = Some(at);
            // A store in the transport's database schedules the copy and completes the
            // received message in one transaction; others leave it to the two steps below.
            let in_store = match (&shared.store, delivery.lock_token()) {
                (Some(store), Some(lock)) => {
                    let seal = shared.timeout_seal.as_deref();
                    let timeout = timeout_rows::timeout_id(seal, &shared.name, &delivery.message().envelope);
                    store
                        .schedule_retry(&shared.name, lock, copy.clone(), timeout, at)
                        .await
                }
                _ => Ok(false),
            };
            let scheduled = match in_store {
                Ok(true) => Ok(true),
                Err(e) => Err(e),
                Ok(false) => match shared.bus.sender(&shared.name, false).await {
                    Ok(sender) => sender.send(copy).await.map_err(Error::from).map(|()| false),
                    Err(e) => Err(e),
                },
            };
            match scheduled {
                Err(e) if e.is_lock_lost() => {
                    tracing::warn!(
                        error = %e,
                        "lock lost before the delayed retry was scheduled; nothing was scheduled and the message \
                         will be delivered again"
                    );
                }
                Ok(true) => {
                    record_history(shared, tried, |r, a| {
                        r.failed(delivery.message(), a, HistoryKind::Retried, error_text.clone(), None)
                    })
                    .await;
                    shared.stats.retried.fetch_add(1, Ordering::Relaxed);
                    metrics.retried(true);
                    tracing::warn!(
                        error = %Escaped(&error_text),
                        handler = failure.handler(),
                        delayed_retry = n,
                        due = %at,
                        "handler failed; delayed retry scheduled and the message completed in one transaction"
                    );
                }
                Ok(false) => {
                    record_history(shared, tried, |r, a| {
                        r.failed(delivery.message(), a, HistoryKind::Retried, error_text.clone(), None)
                    })
                    .await;
                    if let Some(store) = &shared.store {
                        let (seal, envelope) = (shared.timeout_seal.as_deref(), &delivery.message().envelope);
                        timeout_rows::retry_scheduled(&**store, seal, &shared.name, envelope, at).await;
                    }
                    shared.stats.retried.fetch_add(1, Ordering::Relaxed);
                    metrics.retried(true);
                    tracing::warn!(
                        error = %Escaped(&error_text),
                        handler = failure.handler(),
                        delayed_retry = n,
                        due = %at,
                        "handler failed; delayed retry scheduled"
                    );
                    if let Err(e) = delivery.complete().await {
                        tracing::warn!(
                            error = %e,
                            "completion after scheduling a delayed retry failed; the message may be handled twice"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not schedule the delayed retry; handing the message back");
                    if let Err(e) = delivery.abandon().await {
                        tracing::warn!(error = %e, "abandon failed; the lock will expire and the message come back");
                    }
                }
            }
        }
        Decision::Exhausted => {
            dead_letter(
                shared,
                delivery,
                failure.exhausted_reason(),
                error_text,
                properties,
                tried,
            )
            .await;
        }
    }
}

pub(super) async fn dead_letter(
    shared: &Shared,
    delivery: Delivery,
    reason: &'static str,
    description: String,
    properties: Properties,
    tried: Tried,
) {
    let metrics = shared.metrics.of(delivery.message());
    let message_id = delivery.message().envelope.message_id.clone();
    if let Some(store) = &shared.store {
        let envelope = &delivery.message().envelope;
        let seal = shared.timeout_seal.as_deref();
        if timeout_rows::dead_lettered(&**store, seal, &shared.name, envelope, reason, shared.clock.now()).await {
            shared.stats.timeouts_dead_lettered.fetch_add(1, Ordering::Relaxed);
            shared.metrics.timeout_dead_lettered();
        }
    }
    let logged = description.clone();
    // Courier's record of the failure always goes with the dead letter, and replaces
    // every `courier.failure.*` header the message came with (the transports replace the
    // namespace when `courier.failure.endpoint` is written): a producer's forged failure
    // headers never stay beside it (issue 31, point 6).
    let mut properties = properties;
    if !properties.contains_key(headers::FAILURE_ENDPOINT) {
        properties.extend(plain_failure(
            shared,
            &description,
            delivery.message().broker.delivery_count,
        ));
    }
    // The history tells of the dead letter once it is one: the settlement takes the
    // delivery, so the message is kept for it (only when the endpoint keeps a history).
    let received = shared.history.as_ref().map(|_| delivery.message().clone());
    let settlement = Settlement::DeadLetter {
        reason: reason.to_owned(),
        description,
        properties,
    };
    match delivery.settle(settlement).await {
        Ok(()) => {
            if let Some(received) = &received {
                record_history(shared, tried, |r, a| {
                    r.failed(
                        received,
                        a,
                        HistoryKind::DeadLettered,
                        logged.clone(),
                        Some(reason.to_owned()),
                    )
                })
                .await;
            }
            shared.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
            metrics.dead_lettered(reason);
            // The first of a reason in a while in full; a flood as a summary line every
            // few seconds with its count (endpoint/metrics.rs, loglimit.rs).
            if shared.metrics.log_dead_letter(reason, &message_id) {
                tracing::error!(
                    reason,
                    message_id = %Escaped(&message_id),
                    description = %Escaped(&logged),
                    "message dead-lettered"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "dead-lettering failed; the message will be delivered again"),
    }
}
