//! What RabbitMQ cannot honour of the contract (docs/semantics.md), each with what
//! Courier does instead: the transport's bent rules, and the error a call to one of them
//! gets.

use crate::error::{Error, ErrorKind};
use crate::transport::BentRule;

/// The error of a call RabbitMQ cannot honour: `capability` breaks `rule`.
pub(crate) fn unsupported(capability: &'static str, rule: &'static str) -> Error {
    let reason = bent_rules()
        .into_iter()
        .find(|b| b.rule == rule)
        .map_or("RabbitMQ cannot do this", |b| b.reason);
    Error::new(ErrorKind::Unsupported {
        transport: "amqp",
        capability,
        rule,
        reason,
    })
}

pub(super) fn bent_rules() -> Vec<BentRule> {
    vec![
        BentRule {
            rule: "S1.3 batch",
            reason: "a batch of confirmed publishes cannot be all-or-nothing on RabbitMQ (transactions and confirms exclude each other)",
            substitute: "a batch is pipelined; a failure hands back exactly the messages that were not confirmed, to send again with the same ids",
        },
        BentRule {
            rule: "S2.3",
            reason: "RabbitMQ has no lock duration: an unacknowledged message stays with its consumer until it is settled or the channel closes",
            substitute: "a consumer that dies or disconnects gives its messages back at once; a lock duration other than the default 60 s is refused",
        },
        BentRule {
            rule: "S2.4",
            reason: "there is no lock to renew: it lasts as long as the consumer's channel",
            substitute: "Delivery::locked_until is None, so endpoints never renew; renew_lock is refused",
        },
        BentRule {
            rule: "S2.5",
            reason: "AMQP 0-9-1 has no deferral",
            substitute: "keep such messages in the application's store, or schedule them again with Sender::schedule",
        },
        BentRule {
            rule: "S2.5 abandon",
            reason: "basic.nack cannot change the message it requeues",
            substitute: "abandon requeues the message unchanged (delivery count + 1); the endpoint writes its failure headers on the dead-lettered copy",
        },
        BentRule {
            rule: "S3.1",
            reason: "RabbitMQ does not number messages",
            substitute: "the sending process stamps x-courier-sequence-number: unique and increasing per sending process, not gap-free and not comparable across processes",
        },
        BentRule {
            rule: "S3.2",
            reason: "RabbitMQ does not stamp an enqueued time",
            substitute: "the sender stamps x-courier-enqueued-time (milliseconds) and the AMQP timestamp (seconds) from its clock",
        },
        BentRule {
            rule: "S2.6 session queues",
            reason: "a quorum queue counts every return of a message to its partition, also of the messages a process held without handing them out (its whole prefetch goes back when it dies, loses its connection or hands the partition on)",
            substitute: "a process counts the deliveries it hands to a session receiver and dead-letters at the queue's max delivery count; the count starts again at 1 when the partition moves to another process, and the partition's x-delivery-limit of 100 returns ends a crash loop",
        },
        BentRule {
            rule: "S4.1 across processes",
            reason: "RabbitMQ has no lock per session: its only exclusivity is a queue's single active consumer, so a session queue is partition queues and a process consumes a whole partition",
            substitute: "the session lock (the lock duration by the transport's clock, renewable) excludes the other receivers of its process; across processes, only the process RabbitMQ made the active consumer of the session's partition gets the session's messages, so one process at a time handles a session, and a session accepted by name in another process receives nothing until RabbitMQ hands the partition over",
        },
        BentRule {
            rule: "S4.1 subscriptions",
            reason: "a topic's fanout exchange cannot route a subscription's copy to a partition by session id",
            substitute: "subscribe with a plain subscription and send on to a session queue; a subscription with requires_session is refused",
        },
        BentRule {
            rule: "S4.3",
            reason: "RabbitMQ has nowhere to keep a session's state beside its messages",
            substitute: "keep the state in the application's store (a saga's data, keyed by the session id); session_state and set_session_state are refused",
        },
        BentRule {
            rule: "S6.1",
            reason: "RabbitMQ cannot browse a queue without taking its messages",
            substitute: "counts() gives ready, dead-lettered and scheduled counts; the management UI shows messages",
        },
    ]
}
