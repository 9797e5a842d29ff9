//! A session queue's partitions on the RabbitMQ side: consuming each partition for its
//! hub (again after every channel loss, or once drained: `session_balance.rs`), sorting
//! the deliveries into their sessions (`Hub::arrive`), and moving to the dead-letter queue
//! what breaks the wire format, has no session id, has expired, or reached the max
//! delivery count. The hub's bookkeeping of sessions and leases is `sessions.rs`'s.

use std::sync::Arc;

use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Acker, BasicProperties, Channel};
use uuid::Uuid;

use crate::endpoint::recoverability::headers;
use crate::error::Result;
use crate::message::{Envelope, ReceivedMessage, reasons};

use super::conn::connection_error;
use super::sessions::{Hub, PARTITION_PREFETCH, RECONSUME_AFTER, SESSION_PARTITIONS, partition_queue};
use super::{Inner, inspect, wire};

/// The copy of `envelope` that goes to the dead-letter queue, with the dead-letter
/// headers; a producer's failure headers are left out.
pub(crate) fn dead_copy(envelope: &Envelope, reason: &str, description: &str, source: &str) -> Envelope {
    let mut copy = envelope.clone();
    copy.properties.retain(|k, _| !k.starts_with(headers::FAILURE_PREFIX));
    wire::dead_letter_headers(&mut copy, reason, description, source);
    copy
}

/// Publishes `copy` into `dlq`, confirmed, then acks the original and counts it (metric
/// `courier.dead_lettered`, by `reason`); requeues the original when the copy is not
/// confirmed.
pub(crate) async fn move_to_dead_letters(
    inner: &Inner,
    (source, dlq, reason): (&str, &str, &'static str),
    acker: Acker,
    copy: &Envelope,
    raw: Option<BasicProperties>,
) {
    let result = inner
        .dead_letter_many(dlq, [(copy, raw.as_ref())].into_iter())
        .await
        .into_iter()
        .next()
        .unwrap_or(Ok(()));
    match result {
        Ok(()) => {
            crate::endpoint::metrics::count_dead_lettered("amqp", source, reason, 1);
            inner.conn.acked(acker.ack(BasicAckOptions::default())).await;
        }
        Err(e) => {
            tracing::error!(dead_letter_queue = %dlq, error = %e,
                "cannot move a message of a session queue to its dead-letter queue; it is requeued");
            let requeue = BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            };
            inner.conn.acked(acker.nack(requeue)).await;
        }
    }
}

/// Consumes partition `index` of the hub's queue for as long as the hub runs, again
/// after every channel loss.
pub(crate) async fn run_partition(inner: Arc<Inner>, hub: Arc<Hub>, index: u16) {
    let queue = partition_queue(&hub.queue, index, SESSION_PARTITIONS);
    loop {
        if hub.stop.is_cancelled() {
            return;
        }
        match consume(&inner, &queue).await {
            Ok((channel, consumer)) => {
                pump(&inner, &hub, index, &channel, consumer).await;
                if channel.status().connected() {
                    let _ = channel.close(200, "OK".into()).await;
                }
            }
            Err(e) if !inner.conn.is_closed() => {
                tracing::warn!(queue = %queue, error = %e, "cannot consume a partition of a session queue; trying again");
            }
            Err(_) => return,
        }
        hub.forget_partition(index);
        tokio::select! {
            () = hub.stop.cancelled() => return,
            () = tokio::time::sleep(RECONSUME_AFTER) => {}
        }
    }
}

async fn consume(inner: &Inner, queue: &str) -> Result<(Channel, lapin::Consumer)> {
    let channel = inner.conn.channel().await?;
    channel
        .basic_qos(PARTITION_PREFETCH, BasicQosOptions::default())
        .await
        .map_err(|e| connection_error("cannot set the prefetch", &e))?;
    let tag = format!("courier-session-{}", Uuid::new_v4().simple());
    let consumer = channel
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| connection_error("cannot consume a partition", &e))?;
    Ok((channel, consumer))
}

/// Sorts the partition's deliveries into sessions until the channel or the hub stops.
/// A delivery that breaks the wire format, has expired, or has no session id goes to the
/// dead-letter queue at once.
async fn pump(inner: &Arc<Inner>, hub: &Arc<Hub>, index: u16, channel: &Channel, mut consumer: lapin::Consumer) {
    loop {
        let next = tokio::select! {
            () = hub.stop.cancelled() => return,
            () = hub.until_drained(inner, index) => {
                tracing::debug!(queue = %hub.queue, partition = index, "a partition drained; it goes to another process");
                return;
            }
            next = consumer.next() => next,
        };
        let Some(Ok(d)) = next else { return };
        let now = inner.clock.now();
        let decoded = wire::decode(&d.properties, d.data, false, d.redelivered, None, now);
        let message = ReceivedMessage {
            envelope: decoded.envelope,
            broker: decoded.broker,
        };
        let findings = inspect::inspect(&d.properties, &message.envelope, inner.max_message_size);
        inner.wire.ignored(findings.ignored.len());
        let refusal = findings.refusal.map(|r| (r.reason, r.description)).or_else(|| {
            message.envelope.session_id.is_none().then(|| {
                (
                    reasons::INVALID_WIRE_FORMAT,
                    "a message of a session queue has no session id".to_owned(),
                )
            })
        });
        if let Some((reason, description)) = refusal {
            inner.wire.refused();
            tracing::warn!(queue = %hub.queue, reason, problem = %crate::logtext::Escaped(&description),
                "a message of a session queue breaks the wire format; it was moved to the dead-letter queue");
            let copy = dead_copy(&message.envelope, reason, &description, &hub.queue);
            let raw = wire::refused_copy(&d.properties, reason, &description, &hub.queue);
            let route = (hub.queue.as_str(), hub.dead_letter_queue.as_str(), reason);
            move_to_dead_letters(inner, route, d.acker, &copy, Some(raw)).await;
            continue;
        }
        if message.broker.expires_at.is_some_and(|at| at <= now) {
            let description = "the message's time-to-live passed before it was received";
            let copy = dead_copy(&message.envelope, reasons::TTL_EXPIRED, description, &hub.queue);
            let route = (hub.queue.as_str(), hub.dead_letter_queue.as_str(), reasons::TTL_EXPIRED);
            move_to_dead_letters(inner, route, d.acker, &copy, None).await;
            continue;
        }
        let session = message.envelope.session_id.clone().unwrap_or_default();
        hub.arrive(index, channel, d.acker, message, session);
    }
}
