//! How an endpoint runs a saga: one erased handler per message type, which finds the
//! instance, runs the saga's handler on it and saves it in the message's transaction.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use super::{
    Completion, Correlate, Frame, NotFound, Role, Saga, SagaContext, SagaFn, SagaHandlers, SagaOptions, headers,
};
use crate::endpoint::context::Context;
use crate::endpoint::handler::{BoxFuture, HandlerError, Message};
use crate::endpoint::observe::{RequestedTimeout, SagaEffects};
use crate::endpoint::{ErasedHandler, Failure};
use crate::error::{Error, ErrorKind};
use crate::message::PropertyValue;

/// Counters of an endpoint's sagas.
#[derive(Debug, Default)]
pub(crate) struct SagaStats {
    pub(crate) not_found: AtomicU64,
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

/// Serializes the handling of messages of one saga instance inside this process.
#[derive(Debug, Default)]
struct InstanceLocks {
    held: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl InstanceLocks {
    async fn lock(self: &Arc<Self>, correlation: &str) -> InstanceGuard {
        let lock = {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            held.entry(correlation.to_owned()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        InstanceGuard {
            locks: self.clone(),
            key: correlation.to_owned(),
            _guard: Some(guard),
        }
    }
}

struct InstanceGuard {
    locks: Arc<InstanceLocks>,
    key: String,
    _guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for InstanceGuard {
    fn drop(&mut self) {
        // Release the mutex first, then forget the entry if nobody else holds or waits.
        self._guard = None;
        let mut held = self.locks.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.get(&self.key).is_some_and(|m| Arc::strong_count(m) == 1) {
            held.remove(&self.key);
        }
    }
}

/// What a saga and the endpoint share.
pub(crate) struct SagaShared {
    options: SagaOptions,
    locks: Arc<InstanceLocks>,
    stats: Arc<SagaStats>,
}

type Build = Box<dyn FnOnce(Arc<SagaShared>) -> Registered + Send>;

/// One handler of a saga, before the endpoint builds it.
pub(crate) struct Entry<S> {
    pub(crate) name: &'static str,
    pub(crate) role: Role,
    message: (TypeId, &'static str),
    build: Build,
    saga: std::marker::PhantomData<fn() -> S>,
}

/// A saga handler made ready for the endpoint's registry.
pub(crate) struct Registered {
    pub(crate) type_id: TypeId,
    pub(crate) type_name: &'static str,
    pub(crate) name: &'static str,
    pub(crate) aliases: &'static [&'static str],
    pub(crate) handler: Arc<dyn ErasedHandler>,
}

impl<S: Saga> Entry<S> {
    pub(crate) fn new<M: Message>(
        name: &'static str,
        role: Role,
        correlate: Option<Correlate<M>>,
        f: SagaFn<S, M>,
    ) -> Self {
        Self {
            name,
            role,
            message: (TypeId::of::<M>(), M::NAME),
            build: Box::new(move |shared| Registered {
                type_id: TypeId::of::<M>(),
                type_name: std::any::type_name::<M>(),
                name: M::NAME,
                aliases: M::ALIASES,
                handler: Arc::new(SagaHandler {
                    name,
                    role,
                    correlate,
                    f,
                    shared,
                }),
            }),
            saga: std::marker::PhantomData,
        }
    }
}

/// The endpoint's handlers of saga `S`; `Err` names a saga that cannot work.
pub(crate) fn register<S: Saga>(options: SagaOptions, stats: Arc<SagaStats>) -> Result<Vec<Registered>, String> {
    let mut handlers = SagaHandlers::<S>::new();
    S::register(&mut handlers);
    if !handlers.entries.iter().any(|e| e.role == Role::Start) {
        return Err(format!(
            "saga {} has no start handler: no message can create an instance",
            S::NAME
        ));
    }
    let mut names = std::collections::HashSet::new();
    if let Some(dup) = handlers.entries.iter().find(|e| !names.insert(e.name)) {
        return Err(format!("saga {} has two handlers named {}", S::NAME, dup.name));
    }
    let mut messages = std::collections::HashSet::new();
    if let Some(dup) = handlers.entries.iter().find(|e| !messages.insert(e.message.0)) {
        return Err(format!(
            "saga {} handles {} twice (in {}): which correlation finds the instance is ambiguous",
            S::NAME,
            dup.message.1,
            dup.name
        ));
    }
    let shared = Arc::new(SagaShared {
        options,
        locks: Arc::default(),
        stats,
    });
    Ok(handlers
        .entries
        .into_iter()
        .map(|e| (e.build)(shared.clone()))
        .collect())
}

struct SagaHandler<S, M> {
    name: &'static str,
    role: Role,
    correlate: Option<Correlate<M>>,
    f: SagaFn<S, M>,
    shared: Arc<SagaShared>,
}

fn text_header(ctx: &Context, name: &str) -> Option<String> {
    match ctx.received().envelope.properties.get(name) {
        Some(PropertyValue::String(s)) => Some(s.clone()),
        Some(PropertyValue::Int(i)) => Some(i.to_string()),
        _ => None,
    }
}

impl<S: Saga, M: Message> SagaHandler<S, M> {
    fn permanent(&self, text: String) -> Failure {
        Failure::Handler {
            handler: self.name,
            error: HandlerError::permanent(text),
        }
    }

    /// The instance's correlation value and, for a timeout, its id.
    fn correlation(&self, message: &M, ctx: &Context) -> Result<(String, Option<String>), Failure> {
        match (&self.correlate, self.role) {
            (_, Role::Timeout) => {
                let id = text_header(ctx, headers::TIMEOUT_ID);
                let saga = text_header(ctx, headers::SAGA_TYPE);
                let correlation = text_header(ctx, headers::CORRELATION);
                match (id, saga, correlation) {
                    (Some(id), Some(saga), Some(c)) if saga == S::NAME => Ok((c, Some(id))),
                    _ => Err(self.permanent(format!(
                        "a {} message reached the timeout handler {} of saga {} without the headers of one of its \
                         timeouts (only SagaContext::request_timeout makes them)",
                        M::NAME,
                        self.name,
                        S::NAME
                    ))),
                }
            }
            (Some(Correlate::By(f)), _) => Ok((f(message), None)),
            (Some(Correlate::Header(h)), _) => match text_header(ctx, h) {
                Some(c) => Ok((c, None)),
                None => Err(self.permanent(format!(
                    "the {} message has no header {h:?}, which saga {} correlates it by",
                    M::NAME,
                    S::NAME
                ))),
            },
            (None, _) => Err(self.permanent(format!("saga handler {} has no correlation", self.name))),
        }
    }

    async fn run(&self, ctx: &mut Context) -> Result<(), Failure> {
        let envelope = &ctx.received().envelope;
        let message = M::from_envelope(envelope).map_err(|error| Failure::Decode {
            message_type: M::NAME,
            content_type: envelope.content_type.clone(),
            error,
        })?;
        let (correlation, timeout_id) = self.correlation(&message, ctx)?;
        let store_error = |e: Error| {
            if matches!(e.kind(), ErrorKind::Conflict { .. }) {
                self.shared.stats.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            Failure::Store(e)
        };
        // One message of an instance at a time in this process, until its transaction
        // ends: conflicts only come from other processes.
        let instance = self.shared.locks.lock(&correlation).await;
        ctx.hold_until_commit(Box::new(instance));
        let endpoint = ctx.endpoint().to_owned();
        let Some(work) = ctx.unit_of_work_mut() else {
            return Err(self.permanent(format!(
                "saga {} runs on endpoint {endpoint}, which has no store: add EndpointBuilder::store",
                S::NAME
            )));
        };
        if let Some(id) = &timeout_id
            && !work.take_timeout(id).await.map_err(store_error)?
        {
            self.shared.stats.timeouts_discarded.fetch_add(1, Ordering::Relaxed);
            tracing::info!(saga = S::NAME, correlation = %correlation, timeout = %id,
                "timeout discarded: it was cancelled or its saga completed");
            ctx.observe_saga(|| SagaEffects {
                saga_type: S::NAME,
                correlation: correlation.clone(),
                discarded: Some(id.clone()),
                ..SagaEffects::default()
            });
            return Ok(());
        }
        let loaded = work.load_saga(S::NAME, &correlation).await.map_err(store_error)?;
        let (mut state, version) = match loaded {
            Some(stored) => {
                let state: S = serde_json::from_str(&stored.state).map_err(|e| {
                    self.permanent(format!(
                        "the stored state of saga {} instance {correlation:?} does not decode: {e}",
                        S::NAME
                    ))
                })?;
                (state, Some(stored.version))
            }
            None if self.role == Role::Start => (S::default(), None),
            None => {
                self.shared.stats.not_found.fetch_add(1, Ordering::Relaxed);
                return match self.shared.options.not_found {
                    NotFound::Complete => {
                        tracing::info!(saga = S::NAME, correlation = %correlation, message_type = M::NAME,
                            "no saga instance for the message; completing it");
                        Ok(())
                    }
                    NotFound::DeadLetter => Err(Failure::SagaNotFound {
                        saga: S::NAME,
                        correlation,
                    }),
                };
            }
        };
        let mut frame = Frame {
            saga_type: S::NAME,
            correlation: correlation.clone(),
            is_new: version.is_none(),
            ..Frame::default()
        };
        {
            let mut sc = SagaContext::new(ctx, &mut frame);
            (self.f)(&mut state, message, &mut sc)
                .await
                .map_err(|error| Failure::Handler {
                    handler: self.name,
                    error,
                })?;
        }
        let json = serde_json::to_string(&state)
            .map_err(|e| self.permanent(format!("the state of saga {} does not encode: {e}", S::NAME)))?;
        let now = ctx.clock().now();
        ctx.observe_saga(|| SagaEffects {
            saga_type: S::NAME,
            correlation: correlation.clone(),
            completed: frame.completed,
            requested: frame
                .timeouts
                .iter()
                .map(|t| RequestedTimeout {
                    id: t.id.clone(),
                    due: t.due,
                    envelope: t.envelope.clone(),
                })
                .collect(),
            cancelled: frame.cancelled.clone(),
            fired: timeout_id.clone(),
            discarded: None,
        });
        let Some(work) = ctx.unit_of_work_mut() else {
            return Err(self.permanent("the saga's transaction went away".into()));
        };
        if frame.completed {
            let archive = self.shared.options.completion == Completion::Archive;
            work.complete_saga(S::NAME, &correlation, &json, version, archive, now)
                .await
                .map_err(store_error)?;
            return Ok(());
        }
        work.save_saga(S::NAME, &correlation, &json, version, now)
            .await
            .map_err(store_error)?;
        work.cancel_timeouts(&frame.cancelled).await.map_err(store_error)?;
        if !frame.timeouts.is_empty() {
            let earliest = frame.timeouts.iter().map(|t| t.due).min();
            work.add_timeouts(&endpoint, S::NAME, &correlation, frame.timeouts, now)
                .await
                .map_err(store_error)?;
            if let Some(due) = earliest {
                ctx.note_timeout(due);
            }
        }
        Ok(())
    }
}

impl<S: Saga, M: Message> ErasedHandler for SagaHandler<S, M> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn call<'a>(&'a self, ctx: &'a mut Context) -> BoxFuture<'a, Result<(), Failure>> {
        Box::pin(self.run(ctx))
    }
}
