//! What happens to a message whose handling failed: immediate retries, delayed retries,
//! then the dead-letter queue with the failure written on the message.

use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// Dead-letter reasons the endpoint writes.
pub mod reasons {
    /// The message has no type, or no handler of this endpoint knows its type.
    pub const UNKNOWN_MESSAGE_TYPE: &str = "courier.UnknownMessageType";
    /// The body could not be decoded into the message type (or upcast to its version).
    pub const DESERIALIZATION_FAILED: &str = "courier.DeserializationFailed";
    /// The message is of a wire version this code cannot read: newer than the type's
    /// [`Message::VERSION`](crate::Message::VERSION), older with no upcaster step from it,
    /// or a version header that is not one. The description names the version found and
    /// the versions known.
    pub const UNSUPPORTED_MESSAGE_VERSION: &str = "courier.UnsupportedMessageVersion";
    /// A handler returned an error it marked permanent.
    pub const PERMANENT_FAILURE: &str = "courier.PermanentFailure";
    /// Every immediate and delayed retry failed.
    pub const RETRIES_EXHAUSTED: &str = "courier.RetriesExhausted";
    /// The message was handled and its effects committed with a store, but the messages
    /// its handlers sent could not be dispatched through every retry. They stay in the
    /// outbox, and the endpoint's outbox sweeper keeps sending them.
    pub const DISPATCH_FAILED: &str = "courier.DispatchFailed";
    /// A handler sent a message the transport can never accept (over its size limit, a
    /// reserved header, an id, field or scheduled time out of range): the handling failed
    /// when it sent, before anything was committed. The description names the outgoing
    /// message (type, id, destination) and why it was refused.
    pub const INVALID_OUTGOING_MESSAGE: &str = "courier.InvalidOutgoingMessage";
    /// The message has no message id, and the endpoint keeps an inbox: it could not
    /// recognise a redelivery, so it refuses the message unless it was built with
    /// [`EndpointBuilder::accept_messages_without_id`](crate::EndpointBuilder::accept_messages_without_id).
    pub const MISSING_MESSAGE_ID: &str = "courier.MissingMessageId";
    /// An outbox message that the transport refused for good when it was dispatched (see
    /// [`Store::dead_letter_outbox`](crate::Store::dead_letter_outbox)): it was moved to the
    /// outbox's dead letters with this reason instead of being retried forever.
    pub const DISPATCH_REFUSED: &str = "courier.DispatchRefused";
    /// Not a message's: the reason on a saga timeout's row (`dead_letter_reason`, shown by
    /// `courier::admin` and `courier timeouts`) that the timeout dispatcher marked
    /// dead-lettered because it had sent the timeout its most times
    /// ([`EndpointBuilder::max_timeout_dispatches`](crate::EndpointBuilder::max_timeout_dispatches),
    /// 10 by default) and no handling settled it: the broker dead-lettered its message
    /// by itself (max delivery count reached, e.g. a handler that kills the process), or
    /// it was lost each time. The copies the broker dead-lettered are in the queue's
    /// dead-letter queue; resubmitting one handles the timeout as usual.
    pub const TIMEOUT_DISPATCHES_EXHAUSTED: &str = "courier.TimeoutDispatchesExhausted";
    /// A message reached a saga's timeout handler without the seal the endpoint's timeout
    /// dispatcher writes on each timeout it sends (`courier.saga.timeout_seal`): a copy
    /// made by another producer (with the headers of a real timeout, whose id `courier
    /// timeouts` shows) or altered. Nothing was changed: the saga did not run and the
    /// timeout it names still fires at its due time. See `docs/sagas.md`, "Timeouts".
    pub const FORGED_TIMEOUT: &str = "courier.ForgedTimeout";
    /// The timeout dispatcher's copy of a saga timeout arrived before its due time by the
    /// endpoint's clock (clocks of the endpoint's processes out of step, or a copy sent
    /// again early): refused, nothing was changed; the dispatcher sends the timeout again
    /// after its reclaim wait (5 minutes) and it fires then.
    pub const EARLY_TIMEOUT: &str = "courier.EarlyTimeout";
}

/// The headers (application properties) the endpoint writes on a retried or
/// dead-lettered message.
pub mod headers {
    /// How many delayed retries the message has had (an integer). An endpoint with a
    /// store trusts it only with a valid [`DELAYED_RETRY_SEAL`]; without one it counts as
    /// 0 (and is removed from the headers the handler sees).
    pub const DELAYED_RETRIES: &str = "courier.retry.delayed";
    /// The seal of [`DELAYED_RETRIES`] (64 hex digits): HMAC-SHA256 under the endpoint's
    /// secret ([`Store::endpoint_secret`](crate::Store::endpoint_secret)) of the
    /// endpoint's name, the message id and the count, written with the count on each
    /// delayed retry by an endpoint with a store. See `docs/endpoints.md`.
    pub const DELAYED_RETRY_SEAL: &str = "courier.retry.seal";
    /// The text of the last failure.
    pub const FAILURE_ERROR: &str = "courier.failure.error";
    /// The last failure's error chain, outermost first, one per line.
    pub const FAILURE_CHAIN: &str = "courier.failure.chain";
    /// The handler that failed.
    pub const FAILURE_HANDLER: &str = "courier.failure.handler";
    /// The endpoint where it failed.
    pub const FAILURE_ENDPOINT: &str = "courier.failure.endpoint";
    /// How many attempts were made in all (an integer).
    pub const FAILURE_ATTEMPTS: &str = "courier.failure.attempts";
    /// When the last failure happened (RFC 3339, UTC).
    pub const FAILURE_TIME: &str = "courier.failure.time";
    /// Whether the handler marked the failure permanent (a boolean).
    pub const FAILURE_PERMANENT: &str = "courier.failure.permanent";

    /// The prefix of every failure header above (all but [`DELAYED_RETRIES`] and
    /// [`DELAYED_RETRY_SEAL`]).
    pub const FAILURE_PREFIX: &str = "courier.failure.";

    /// Whether `name` is a header a failed handling writes ([`DELAYED_RETRIES`],
    /// [`DELAYED_RETRY_SEAL`] or one under [`FAILURE_PREFIX`]): what a resubmit of a dead
    /// letter (`courier::admin`) leaves out, on every broker, so its retries start again.
    pub fn is_failure_header(name: &str) -> bool {
        name == DELAYED_RETRIES || name == DELAYED_RETRY_SEAL || name.starts_with(FAILURE_PREFIX)
    }

    /// Every header above, by name (for SQL that removes them one by one, as the embedded
    /// broker's `json_remove` does): each is a failure header.
    pub const FAILURE_HEADERS: [&str; 9] = [
        DELAYED_RETRIES,
        DELAYED_RETRY_SEAL,
        FAILURE_ERROR,
        FAILURE_CHAIN,
        FAILURE_HANDLER,
        FAILURE_ENDPOINT,
        FAILURE_ATTEMPTS,
        FAILURE_TIME,
        FAILURE_PERMANENT,
    ];
}

/// How an endpoint retries a message whose handling failed.
///
/// Immediate retries hand the message back to the broker (abandon), which delivers it
/// again at once; the attempt number is the broker's durable delivery count. When they
/// are used up, a delayed retry sends a copy of the message (same message id, with
/// [`headers::DELAYED_RETRIES`] counting up) scheduled for later to the endpoint's own
/// queue, and completes the original; each delayed retry starts a new round of
/// immediate retries. When the delayed retries are used up too, the message goes to the
/// dead-letter queue with the failure recorded on it. No count lives in memory: a
/// process that dies in the middle resumes where the broker says it was.
///
/// The defaults: 3 immediate retries, then delayed retries after 10 s, 20 s and 30 s:
/// `4 x 4 = 16` attempts in all.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Immediate retries after the first attempt of each round.
    pub immediate_retries: u32,
    /// The delay before each delayed retry; its length is the number of delayed retries.
    pub delayed_retries: Vec<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            immediate_retries: 3,
            delayed_retries: vec![
                Duration::from_secs(10),
                Duration::from_secs(20),
                Duration::from_secs(30),
            ],
        }
    }
}

impl RetryPolicy {
    /// No retries at all: the first failure dead-letters the message.
    pub fn none() -> Self {
        Self {
            immediate_retries: 0,
            delayed_retries: Vec::new(),
        }
    }

    /// Sets the number of immediate retries.
    #[must_use]
    pub fn immediate(mut self, retries: u32) -> Self {
        self.immediate_retries = retries;
        self
    }

    /// Sets the delayed retries, one delay each.
    #[must_use]
    pub fn delayed(mut self, delays: impl IntoIterator<Item = Duration>) -> Self {
        self.delayed_retries = delays.into_iter().collect();
        self
    }

    /// Sets `count` delayed retries growing linearly: `step`, `2 x step`, ...
    #[must_use]
    pub fn delayed_linear(self, count: u32, step: Duration) -> Self {
        self.delayed((1..=count).map(|i| step.saturating_mul(i)))
    }

    /// Attempts per round: the first one and the immediate retries.
    pub fn attempts_per_round(&self) -> u32 {
        self.immediate_retries.saturating_add(1)
    }

    /// The number of the attempt made on the `delivery_count`-th delivery after
    /// `delayed` delayed retries (1 on the first).
    pub fn attempt_number(&self, delayed: u32, delivery_count: u32) -> u32 {
        delayed
            .saturating_mul(self.attempts_per_round())
            .saturating_add(delivery_count)
    }

    /// The most attempts a message gets.
    pub fn max_attempts(&self) -> u32 {
        let rounds = u32::try_from(self.delayed_retries.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        rounds.saturating_mul(self.attempts_per_round())
    }

    /// Checks the ranges.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`] for more than 100 immediate retries or a delay over
    /// 30 days.
    pub fn validate(&self) -> Result<()> {
        if self.immediate_retries > 100 {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: "at most 100 immediate retries".into(),
            }));
        }
        if self
            .delayed_retries
            .iter()
            .any(|d| *d > Duration::from_secs(30 * 24 * 3600))
        {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: "a delayed retry may wait at most 30 days".into(),
            }));
        }
        Ok(())
    }
}

/// What to do with a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Abandon: the broker delivers it again at once.
    Immediate,
    /// Schedule a copy after this delay, as delayed retry number `n`.
    Delayed { n: u32, delay: Duration },
    /// Dead-letter: nothing left to try.
    Exhausted,
}

impl RetryPolicy {
    /// The decision after a retryable failure on the `delivery_count`-th delivery of a
    /// message that had `delayed` delayed retries.
    pub(crate) fn decide(&self, delayed: u32, delivery_count: u32) -> Decision {
        if delivery_count <= self.immediate_retries {
            return Decision::Immediate;
        }
        match usize::try_from(delayed).ok().and_then(|i| self.delayed_retries.get(i)) {
            Some(delay) => Decision::Delayed {
                n: delayed.saturating_add(1),
                delay: *delay,
            },
            None => Decision::Exhausted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_walks_immediate_then_delayed_then_exhausted() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_attempts(), 16);
        assert_eq!(p.decide(0, 1), Decision::Immediate);
        assert_eq!(p.decide(0, 3), Decision::Immediate);
        assert_eq!(
            p.decide(0, 4),
            Decision::Delayed {
                n: 1,
                delay: Duration::from_secs(10)
            }
        );
        assert_eq!(
            p.decide(2, 4),
            Decision::Delayed {
                n: 3,
                delay: Duration::from_secs(30)
            }
        );
        assert_eq!(p.decide(3, 4), Decision::Exhausted);
        assert_eq!(p.decide(3, 9), Decision::Exhausted);
        assert_eq!(p.attempt_number(3, 4), 16);
        assert_eq!(RetryPolicy::none().decide(0, 1), Decision::Exhausted);
    }

    #[test]
    fn linear_delays() {
        let p = RetryPolicy::default().delayed_linear(3, Duration::from_secs(10));
        assert_eq!(p, RetryPolicy::default());
        assert!(RetryPolicy::default().immediate(101).validate().is_err());
    }
}

#[cfg(test)]
mod failure_header_tests {
    use super::headers::{FAILURE_HEADERS, is_failure_header};

    #[test]
    fn the_list_and_the_predicate_name_the_same_headers() {
        assert!(FAILURE_HEADERS.iter().all(|h| is_failure_header(h)));
        assert!(!is_failure_header("courier.failurex"));
        assert!(!is_failure_header("tenant"));
    }
}
