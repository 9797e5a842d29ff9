//! Queues, topics, subscriptions and their settings.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// The longest entity name accepted.
pub const MAX_NAME_LEN: usize = 120;

/// Checks a queue, topic or subscription name: 1 to [`MAX_NAME_LEN`] characters from
/// `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
///
/// # Errors
/// [`ErrorKind::InvalidEntityName`] saying what is wrong.
pub fn validate_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("it is longer than 120 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some("only ASCII letters, digits, '.', '_' and '-' are allowed")
    } else if !name.as_bytes()[0].is_ascii_alphanumeric() {
        Some("it must start with a letter or a digit")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(Error::new(ErrorKind::InvalidEntityName {
            name: name.chars().take(300).collect(),
            reason,
        })),
    }
}

/// Which part of an entity a receiver reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SubQueue {
    /// The entity itself.
    #[default]
    Main,
    /// Its dead-letter sub-queue.
    DeadLetter,
}

/// Something a receiver can read from: a queue, or a topic's subscription, or the
/// dead-letter sub-queue of either.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntityPath {
    topic: Option<String>,
    name: String,
    sub_queue: SubQueue,
}

impl EntityPath {
    /// A queue.
    pub fn queue(name: impl Into<String>) -> Self {
        Self {
            topic: None,
            name: name.into(),
            sub_queue: SubQueue::Main,
        }
    }

    /// A subscription of a topic.
    pub fn subscription(topic: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            topic: Some(topic.into()),
            name: name.into(),
            sub_queue: SubQueue::Main,
        }
    }

    /// The dead-letter sub-queue of this entity.
    #[must_use]
    pub fn dead_letter(mut self) -> Self {
        self.sub_queue = SubQueue::DeadLetter;
        self
    }

    /// The topic, for a subscription.
    pub fn topic(&self) -> Option<&str> {
        self.topic.as_deref()
    }

    /// The queue's or subscription's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which sub-queue.
    pub fn sub_queue(&self) -> SubQueue {
        self.sub_queue
    }

    /// Checks every name in the path.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidEntityName`].
    pub fn validate(&self) -> Result<()> {
        if let Some(t) = &self.topic {
            validate_name(t)?;
        }
        validate_name(&self.name)
    }
}

impl fmt::Display for EntityPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.topic {
            Some(t) => write!(f, "{t}/subscriptions/{}", self.name)?,
            None => f.write_str(&self.name)?,
        }
        if self.sub_queue == SubQueue::DeadLetter {
            f.write_str("/$deadletterqueue")?;
        }
        Ok(())
    }
}

/// The longest lock duration a queue may have (S2.3).
pub const MAX_LOCK_DURATION: Duration = Duration::from_secs(300);

/// Settings of a queue or subscription (S2.3, S2.6).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueOptions {
    /// How long a PeekLock receive locks a message: default 60 s, at most 5 min.
    pub lock_duration: Duration,
    /// How many locks a message gets before the broker dead-letters it: default 10.
    pub max_delivery_count: u32,
    /// Time-to-live of messages that set none (and the upper bound of those that do).
    pub default_time_to_live: Option<Duration>,
    /// Whether messages must carry a session id and are received through sessions (S4).
    pub requires_session: bool,
}

impl Default for QueueOptions {
    fn default() -> Self {
        Self {
            lock_duration: Duration::from_secs(60),
            max_delivery_count: 10,
            default_time_to_live: None,
            requires_session: false,
        }
    }
}

impl QueueOptions {
    /// Sets the lock duration.
    #[must_use]
    pub fn lock_duration(mut self, d: Duration) -> Self {
        self.lock_duration = d;
        self
    }
    /// Sets the max delivery count.
    #[must_use]
    pub fn max_delivery_count(mut self, n: u32) -> Self {
        self.max_delivery_count = n;
        self
    }
    /// Sets the default time-to-live.
    #[must_use]
    pub fn default_time_to_live(mut self, ttl: Duration) -> Self {
        self.default_time_to_live = Some(ttl);
        self
    }
    /// Makes the queue a session queue.
    #[must_use]
    pub fn requires_session(mut self, yes: bool) -> Self {
        self.requires_session = yes;
        self
    }

    /// Checks the ranges.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`].
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::new(ErrorKind::InvalidOptions { reason }));
        if self.lock_duration < Duration::from_millis(1) || self.lock_duration > MAX_LOCK_DURATION {
            return bad(format!(
                "lock duration {:?} must be between 1 ms and 5 min",
                self.lock_duration
            ));
        }
        if self.max_delivery_count == 0 || self.max_delivery_count > 10_000 {
            return bad(format!(
                "max delivery count {} must be between 1 and 10000",
                self.max_delivery_count
            ));
        }
        if let Some(ttl) = self.default_time_to_live
            && (ttl.is_zero() || ttl > MAX_TIME_TO_LIVE)
        {
            return bad(format!(
                "default time-to-live {ttl:?} must be between 1 ms and 100 years"
            ));
        }
        Ok(())
    }
}

/// The longest time-to-live accepted (about 100 years).
pub const MAX_TIME_TO_LIVE: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// Settings of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TopicOptions {
    /// Time-to-live of messages that set none.
    pub default_time_to_live: Option<Duration>,
}

/// Settings of a subscription: the same as a queue's.
pub type SubscriptionOptions = QueueOptions;

/// Counts of the messages of an entity, by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntityCounts {
    /// Active messages (locked or not).
    pub active: u64,
    /// Scheduled messages.
    pub scheduled: u64,
    /// Deferred messages.
    pub deferred: u64,
    /// Messages in the dead-letter sub-queue.
    pub dead_lettered: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name("billing").is_ok());
        assert!(validate_name("a.b_c-1").is_ok());
        for bad in ["", "-x", "a b", "q'; DROP TABLE x; --", "ü", "a/b"] {
            let e = validate_name(bad).unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::InvalidEntityName { .. }), "{bad}");
            assert!(!e.is_transient());
        }
        assert!(validate_name(&"a".repeat(120)).is_ok());
        assert!(validate_name(&"a".repeat(121)).is_err());
    }

    #[test]
    fn lock_duration_is_bounded() {
        assert!(QueueOptions::default().validate().is_ok());
        assert!(
            QueueOptions::default()
                .lock_duration(Duration::from_secs(301))
                .validate()
                .is_err()
        );
        assert!(QueueOptions::default().max_delivery_count(0).validate().is_err());
    }
}
