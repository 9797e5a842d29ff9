//! What the endpoint keeps for its sagas, and the seam through which a saga joins it: the
//! endpoint defines [`SagaRegistration`] and the saga module implements it (for every
//! `Saga`, in `saga/registration.rs`, which also holds `EndpointBuilder::saga` and
//! `saga_with`). The endpoint never names the saga module: what both need lives here
//! (the counters of the endpoint's sagas, the timeout signal its dispatcher waits on, the
//! owner of saga instance locks, a saga's handlers made ready for the registry).

use std::any::TypeId;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use super::handler::Declared;
use super::{EndpointBuilder, ErasedHandler, Registration};

/// What an endpoint takes of a saga; the saga module implements it for every saga type
/// with its options.
pub(crate) trait SagaRegistration {
    /// The saga type's name (a saga is added once).
    fn name(&self) -> &'static str;
    /// The messages the saga declared it sends.
    fn declared(&self) -> Declared;
    /// The saga's handlers, one per message type it handles, counting into `stats`; or
    /// what is wrong with the saga, reported when the endpoint starts.
    fn handlers(self, stats: Arc<SagaStats>) -> Result<Vec<Registered>, String>;
}

impl EndpointBuilder {
    /// Adds a saga through its registration (`EndpointBuilder::saga_with`, in the saga
    /// module, calls this).
    pub(crate) fn add_saga(mut self, saga: impl SagaRegistration) -> Self {
        let name = saga.name();
        if self.sagas.contains(&name) {
            self.errors.push(format!("saga {name} was added twice"));
            return self;
        }
        self.sagas.push(name);
        self.declared.push((name, saga.declared()));
        match saga.handlers(self.saga_stats.clone()) {
            Ok(handlers) => self.registrations.extend(handlers.into_iter().map(|r| Registration {
                type_id: r.type_id,
                type_name: r.type_name,
                name: r.name,
                aliases: r.aliases,
                handler: super::registry::Handling::One(r.handler),
            })),
            Err(e) => self.errors.push(e),
        }
        self
    }
}

/// A saga handler made ready for the endpoint's registry.
pub(crate) struct Registered {
    pub(crate) type_id: TypeId,
    pub(crate) type_name: &'static str,
    pub(crate) name: &'static str,
    pub(crate) aliases: &'static [&'static str],
    pub(crate) handler: Arc<dyn ErasedHandler>,
}

/// Counters of an endpoint's sagas.
#[derive(Debug, Default)]
pub(crate) struct SagaStats {
    pub(crate) not_found: AtomicU64,
    /// Of those, sent back to the queue to be tried again later.
    pub(crate) not_found_retried: AtomicU64,
    /// Of those, handled by the saga's `#[not_found]` handler.
    pub(crate) not_found_handled: AtomicU64,
    /// Start messages that found the marker of a completed instance.
    pub(crate) late_starts: AtomicU64,
    pub(crate) timeouts_discarded: AtomicU64,
    pub(crate) conflicts: AtomicU64,
}

/// Tells the endpoint's timeout dispatcher that a timeout was stored, and when it is due.
#[derive(Debug)]
pub(crate) struct TimeoutSignal {
    /// The earliest due time (µs) stored since the dispatcher last looked.
    earliest: AtomicI64,
    notify: Notify,
}

impl Default for TimeoutSignal {
    fn default() -> Self {
        Self {
            earliest: AtomicI64::new(i64::MAX),
            notify: Notify::new(),
        }
    }
}

impl TimeoutSignal {
    /// A timeout due at `due` committed.
    pub(crate) fn stored(&self, due: DateTime<Utc>) {
        self.earliest.fetch_min(due.timestamp_micros(), Ordering::AcqRel);
        self.notify.notify_one();
    }

    /// Takes the earliest due time signalled since the last call.
    pub(crate) fn take_earliest(&self) -> Option<DateTime<Utc>> {
        let at = self.earliest.swap(i64::MAX, Ordering::AcqRel);
        (at != i64::MAX).then(|| DateTime::from_timestamp_micros(at)).flatten()
    }

    /// Waits for the next signal.
    pub(crate) async fn wait(&self) {
        self.notify.notified().await;
    }
}

/// Who takes an instance lock: a handling, or the commit group it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockOwner {
    pub(crate) id: u64,
    /// Whether the wait is bounded by the saga runtime's `LOCK_WAIT_LIMIT` (on grouping endpoints).
    pub(crate) bounded: bool,
}
