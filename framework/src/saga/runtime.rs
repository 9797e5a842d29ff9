//! How an endpoint runs a saga: one erased handler per message type, which finds the
//! instance, runs the saga's handler on it and saves it in the message's transaction.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};

use super::locks::InstanceLocks;
use super::state::StateError;
use super::{
    Completion, Correlate, Frame, LateStart, NotFound, NotFoundFn, RetryNotFound, Role, Saga, SagaContext, SagaFn,
    SagaHandlers, SagaOptions, headers,
};
use crate::endpoint::context::Context;
use crate::endpoint::handler::{BoxFuture, HandlerError, Message};
use crate::endpoint::metrics::SagaTally;
use crate::endpoint::not_found_seal;
use crate::endpoint::observe::{RequestedTimeout, SagaEffects};
use crate::endpoint::otel;
use crate::endpoint::sagas::{Registered, SagaStats};
use crate::endpoint::timeout_seal::{self, TimeoutSeal, Verdict};
use crate::endpoint::{ErasedHandler, Failure};
use crate::error::{Error, ErrorKind};
use crate::logtext::Escaped;
use crate::message::PropertyValue;
use crate::recoverability::reasons;

/// The longest delay of [`SagaOptions::retry_not_found`]: a year.
const MAX_RETRY_DELAY: std::time::Duration = std::time::Duration::from_secs(365 * 86_400);

/// The longest retention of [`SagaOptions::remember_completed`]: ten years.
const MAX_RETENTION: std::time::Duration = std::time::Duration::from_secs(10 * 365 * 86_400);

/// What a saga and the endpoint share.
pub(crate) struct SagaShared {
    options: SagaOptions,
    locks: Arc<InstanceLocks>,
    stats: Arc<SagaStats>,
}

/// A not-found handler, its `NotFoundFn<M>` erased until the handler of `M` takes it.
type ErasedNotFound = Box<dyn Any + Send>;

type Build = Box<dyn FnOnce(Arc<SagaShared>, Option<ErasedNotFound>, Option<RetryNotFound>) -> Registered + Send>;

/// One handler of a saga, before the endpoint builds it.
pub(crate) struct Entry<S> {
    pub(crate) name: &'static str,
    pub(crate) role: Role,
    message: (TypeId, &'static str),
    build: Build,
    saga: std::marker::PhantomData<fn() -> S>,
}

/// A not-found handler of a saga, before the handler of its message type takes it.
pub(crate) struct NotFoundEntry {
    name: &'static str,
    message: (TypeId, &'static str),
    f: ErasedNotFound,
}

impl NotFoundEntry {
    pub(crate) fn new<M: Message>(name: &'static str, f: NotFoundFn<M>) -> Self {
        Self {
            name,
            message: (TypeId::of::<M>(), M::NAME),
            f: Box::new((name, f)),
        }
    }
}

impl<S: Saga> Entry<S> {
    pub(crate) fn new<M: Message>(
        name: &'static str,
        role: Role,
        correlate: Option<Correlate<M>>,
        property: Option<&'static str>,
        f: SagaFn<S, M>,
    ) -> Self {
        Self {
            name,
            role,
            message: (TypeId::of::<M>(), M::NAME),
            build: Box::new(move |shared, not_found: Option<ErasedNotFound>, retry| Registered {
                type_id: TypeId::of::<M>(),
                type_name: std::any::type_name::<M>(),
                name: M::NAME,
                aliases: M::ALIASES,
                handler: Arc::new(SagaHandler {
                    name,
                    role,
                    correlate,
                    property,
                    not_found: not_found
                        .and_then(|b| b.downcast::<(&'static str, NotFoundFn<M>)>().ok())
                        .map(|b| *b),
                    retry,
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
    let mut not_found: HashMap<TypeId, ErasedNotFound> = HashMap::new();
    for nf in handlers.not_found {
        let Some(entry) = handlers.entries.iter().find(|e| e.message.0 == nf.message.0) else {
            return Err(format!(
                "saga {} has a not-found handler {} for {}, a message it does not handle: add the handler that \
                 continues the saga with it (#[handle])",
                S::NAME,
                nf.name,
                nf.message.1
            ));
        };
        if entry.role != Role::Continue {
            return Err(format!(
                "saga {}: {} ({}) {}, so it never finds no instance; the not-found handler {} would never run",
                S::NAME,
                nf.message.1,
                entry.name,
                if entry.role == Role::Start {
                    "starts an instance when none correlates"
                } else {
                    "is a timeout, discarded when its instance is gone"
                },
                nf.name
            ));
        }
        if not_found.insert(nf.message.0, nf.f).is_some() {
            return Err(format!(
                "saga {} has two not-found handlers for {}",
                S::NAME,
                nf.message.1
            ));
        }
    }
    let mut retries: HashMap<TypeId, RetryNotFound> = HashMap::new();
    for (type_id, message, retry) in &options.retry_not_found {
        let Some(entry) = handlers.entries.iter().find(|e| e.message.0 == *type_id) else {
            return Err(format!(
                "saga {}: SagaOptions::retry_not_found::<{message}> names a message the saga does not handle: add \
                 the handler that continues the saga with it (#[handle])",
                S::NAME
            ));
        };
        if entry.role != Role::Continue {
            return Err(format!(
                "saga {}: SagaOptions::retry_not_found::<{message}>: {message} ({}) {}, so it never finds no \
                 instance; only a message the saga continues with (#[handle]) can be tried again",
                S::NAME,
                entry.name,
                if entry.role == Role::Start {
                    "starts an instance when none correlates"
                } else {
                    "is a timeout"
                },
            ));
        }
        if retry.limit == 0 || retry.delay < std::time::Duration::from_millis(1) {
            return Err(format!(
                "saga {}: SagaOptions::retry_not_found::<{message}>({:?}, {}): the delay must be at least 1 ms and \
                 the limit at least 1",
                S::NAME,
                retry.delay,
                retry.limit
            ));
        }
        if chrono::Duration::from_std(retry.delay).is_err() || retry.delay > MAX_RETRY_DELAY {
            return Err(format!(
                "saga {}: SagaOptions::retry_not_found::<{message}>: the delay {:?} is over the limit of {} days",
                S::NAME,
                retry.delay,
                MAX_RETRY_DELAY.as_secs() / 86_400
            ));
        }
        retries.insert(*type_id, *retry);
    }
    if let Some((retention, _)) = options.remember_completed
        && (retention < std::time::Duration::from_millis(1)
            || retention > MAX_RETENTION
            || chrono::Duration::from_std(retention).is_err())
    {
        return Err(format!(
            "saga {}: SagaOptions::remember_completed({retention:?}, ..): the retention must be at least 1 ms and at \
             most {} days",
            S::NAME,
            MAX_RETENTION.as_secs() / 86_400
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
        .map(|e| {
            let nf = not_found.remove(&e.message.0);
            let retry = retries.get(&e.message.0).copied();
            (e.build)(shared.clone(), nf, retry)
        })
        .collect())
}

struct SagaHandler<S, M> {
    name: &'static str,
    role: Role,
    correlate: Option<Correlate<M>>,
    /// The correlation property the correlation value is looked up by, if any.
    property: Option<&'static str>,
    /// The not-found handler of `M`: its name and function.
    not_found: Option<(&'static str, NotFoundFn<M>)>,
    /// How `M` is tried again when it finds no instance, if it is.
    retry: Option<RetryNotFound>,
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
    fn no_store(&self, endpoint: &str) -> Failure {
        self.permanent(format!(
            "saga {} runs on endpoint {endpoint}, which has no store: add EndpointBuilder::store",
            S::NAME
        ))
    }

    /// No instance for the message: its not-found handler, or the saga's policy.
    /// `correlation` says what was looked for.
    /// `completed` is when the instance completed, if its marker says so: too late, not
    /// tried again.
    async fn instance_not_found(
        &self,
        message: M,
        correlation: String,
        completed: Option<DateTime<Utc>>,
        ctx: &mut Context,
    ) -> Result<(), Failure> {
        self.shared.stats.not_found.fetch_add(1, Ordering::Relaxed);
        crate::endpoint::metrics::saga_not_found(ctx.endpoint(), S::NAME);
        let mut retried = (0, std::time::Duration::ZERO);
        if let (Some(_), Some(at)) = (self.retry, completed) {
            tracing::info!(saga = S::NAME, correlation = %Escaped(&correlation), message_type = M::NAME,
                completed_at = %at, "the saga instance completed: the message is too late and is not tried again");
        }
        if let Some(retry) = self.retry.filter(|_| completed.is_none()) {
            let tried = self.tries(ctx);
            if tried < retry.limit {
                self.try_again(ctx, retry, tried + 1)?;
                self.shared.stats.not_found_retried.fetch_add(1, Ordering::Relaxed);
                tracing::info!(saga = S::NAME, correlation = %Escaped(&correlation), message_type = M::NAME,
                    try_number = tried + 1, limit = retry.limit, delay = ?retry.delay,
                    "no saga instance for the message (yet); it comes back later");
                return Ok(());
            }
            retried = (tried, retry.delay);
        }
        if let Some((handler, f)) = self.not_found {
            self.shared.stats.not_found_handled.fetch_add(1, Ordering::Relaxed);
            tracing::info!(saga = S::NAME, correlation = %Escaped(&correlation), message_type = M::NAME, handler,
                "no saga instance for the message; running its not-found handler");
            return f(message, ctx)
                .await
                .map_err(|error| Failure::Handler { handler, error });
        }
        if retried.0 > 0 {
            return Err(Failure::SagaNotFound {
                saga: S::NAME,
                correlation,
                reason: super::reasons::SAGA_NOT_FOUND,
                retried,
            });
        }
        match self.shared.options.not_found {
            NotFound::Complete => {
                tracing::info!(saga = S::NAME, correlation = %Escaped(&correlation), message_type = M::NAME,
                    "no saga instance for the message; completing it");
                Ok(())
            }
            NotFound::DeadLetter => Err(Failure::SagaNotFound {
                saga: S::NAME,
                correlation,
                reason: super::reasons::SAGA_NOT_FOUND,
                retried,
            }),
        }
    }

    /// How many times this saga tried the received message again before: the count of
    /// its sealed copy (`endpoint/not_found_seal.rs`), 0 for a first arrival or a copy
    /// whose seal does not check.
    fn tries(&self, ctx: &Context) -> u32 {
        let keyed = ctx.timeout_seal().map(TimeoutSeal::keyed);
        not_found_seal::read(keyed, ctx.endpoint(), &ctx.received().envelope)
            .filter(|r| r.saga == S::NAME)
            .map_or(0, |r| r.n)
    }

    /// Sends the received message back to the endpoint's queue, due `retry.delay` from
    /// now, as try `n`: a copy with a new message id (the inbox would drop the same one),
    /// without the failure and retry headers of this arrival, sealed.
    fn try_again(&self, ctx: &mut Context, retry: RetryNotFound, n: u32) -> Result<(), Failure> {
        let mut copy = ctx.received().envelope.clone();
        copy.message_id = uuid::Uuid::now_v7().to_string();
        copy.properties.retain(|name, _| {
            !crate::recoverability::headers::is_failure_header(name) && !name.starts_with("courier.saga.")
        });
        let now = ctx.clock().now();
        let delay = chrono::Duration::from_std(retry.delay).unwrap_or(chrono::Duration::MAX);
        copy.scheduled_enqueue_time = Some(now.checked_add_signed(delay).unwrap_or(now));
        let keyed = ctx.timeout_seal().map(TimeoutSeal::keyed);
        not_found_seal::write(keyed, ctx.endpoint(), &mut copy, S::NAME, n);
        ctx.send_copy_to_self(copy).map_err(Failure::Dispatch)
    }

    fn permanent(&self, text: String) -> Failure {
        Failure::Handler {
            handler: self.name,
            error: HandlerError::permanent(text),
        }
    }

    /// Refuses a message that reached this timeout handler unless it is the timeout
    /// dispatcher's copy and due (`endpoint/timeout_seal.rs`): before its body is decoded
    /// and the instance looked up or locked, so a refused copy changes nothing and waits
    /// for nothing.
    fn judge_timeout(&self, ctx: &Context) -> Result<(), Failure> {
        let now = ctx.clock().now();
        let verdict = timeout_seal::judge(ctx.timeout_seal(), ctx.endpoint(), &ctx.received().envelope, now);
        let (reason, detail) = match verdict {
            Verdict::Due => return Ok(()),
            Verdict::Forged(why) => (
                reasons::FORGED_TIMEOUT,
                format!(
                    "{why}; refused by the timeout handler {} of saga {} as forged: the saga did not run, and the \
                     timeout it names (if any) is unchanged and fires at its due time",
                    self.name,
                    S::NAME
                ),
            ),
            Verdict::Early { due } => (
                reasons::EARLY_TIMEOUT,
                format!(
                    "the timeout dispatcher's copy of a {} timeout of saga {} arrived at {} by the endpoint's clock, \
                     before its due time {}: refused, the saga did not run; the timeout is sent again after the \
                     dispatcher's reclaim wait (keep the clocks of the endpoint's processes in step)",
                    M::NAME,
                    S::NAME,
                    now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                    due.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                ),
            ),
        };
        Err(Failure::TimeoutRefused {
            reason,
            handler: self.name,
            detail,
        })
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
        if self.role == Role::Timeout {
            // First: a forged copy is refused as such, whatever its body.
            self.judge_timeout(ctx)?;
            // Checked: the handler has no use for the seal, and must not pass it on (a
            // handler that logs its headers would show it).
            ctx.hide_header(headers::TIMEOUT_SEAL);
        }
        let message = crate::endpoint::version::decode_message::<M>(&ctx.received().envelope)?;
        let (correlation, timeout_id) = self.correlation(&message, ctx)?;
        // (A value looked up through a correlation property is not an instance's
        // correlation: one that long finds no instance, as any value no instance holds.)
        if self.property.is_none() && correlation.len() > super::MAX_CORRELATION {
            return Err(self.permanent(format!(
                "the correlation value of this {} message is {} bytes, over saga {}'s limit of {} bytes \
                 (saga::MAX_CORRELATION: the store indexes it): \"{}\"; correlate by a shorter value, such as an \
                 id, or a hash of this one",
                M::NAME,
                correlation.len(),
                S::NAME,
                super::MAX_CORRELATION,
                crate::checks::quoted(correlation.as_bytes())
            )));
        }
        otel::saga_correlation(&correlation);
        let endpoint_name = ctx.endpoint_name();
        let store_error = |e: Error| {
            if matches!(e.kind(), ErrorKind::Conflict { .. }) {
                self.shared.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                crate::endpoint::metrics::saga_conflict(&endpoint_name, S::NAME);
            }
            Failure::Store(e)
        };
        // Found by a correlation property: the value names the instance through the store.
        let correlation = match self.property {
            None => correlation,
            Some(property) => {
                let endpoint = ctx.endpoint().to_owned();
                let Some(work) = ctx.unit_of_work_mut() else {
                    return Err(self.no_store(&endpoint));
                };
                match work
                    .find_saga_by_property(S::NAME, property, &correlation)
                    .await
                    .map_err(store_error)?
                {
                    Some(found) => found,
                    None => {
                        let missing = format!("{property} = {correlation:?}");
                        return self.instance_not_found(message, missing, None, ctx).await;
                    }
                }
            }
        };
        // One message of an instance at a time in this process, until its transaction
        // ends: conflicts only come from other processes.
        let instance = self
            .shared
            .locks
            .lock(&correlation, ctx.lock_owner())
            .await
            .map_err(store_error)?;
        ctx.hold_until_commit(Box::new(instance));
        let endpoint = ctx.endpoint().to_owned();
        let now = ctx.clock().now();
        let Some(work) = ctx.unit_of_work_mut() else {
            return Err(self.no_store(&endpoint));
        };
        if let Some(id) = &timeout_id
            && !work.take_timeout(id).await.map_err(store_error)?
        {
            self.shared.stats.timeouts_discarded.fetch_add(1, Ordering::Relaxed);
            tracing::info!(saga = S::NAME, correlation = %Escaped(&correlation), timeout = %Escaped(id),
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
        // With markers kept: when this correlation's last instance completed, if it did.
        let completed = match (&loaded, self.shared.options.remember_completed) {
            (None, Some(_)) if self.role == Role::Start || self.retry.is_some() => work
                .saga_completed_at(S::NAME, &correlation, now)
                .await
                .map_err(store_error)?,
            _ => None,
        };
        let mut completed_before = None;
        if let (Some(at), Role::Start, Some((_, late))) = (completed, self.role, self.shared.options.remember_completed)
        {
            self.shared.stats.late_starts.fetch_add(1, Ordering::Relaxed);
            let when = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            match late {
                LateStart::StartNew => completed_before = Some(at),
                LateStart::DeadLetter => {
                    return Err(Failure::SagaRefused {
                        reason: super::reasons::SAGA_COMPLETED,
                        handler: self.name,
                        detail: format!(
                            "saga {} instance {correlation:?} completed at {when}: this {} would start it again \
                             (SagaOptions::remember_completed with LateStart::DeadLetter); nothing was changed",
                            S::NAME,
                            M::NAME
                        ),
                    });
                }
                LateStart::Ignore => {
                    tracing::info!(saga = S::NAME, correlation = %Escaped(&correlation), message_type = M::NAME,
                        completed_at = %when, "a start message of a saga instance that completed; completed \
                        without handling it (SagaOptions::remember_completed)");
                    return Ok(());
                }
            }
        }
        // The state before, for an observer or the history (not copied otherwise).
        let before = if ctx.is_observing() {
            loaded.as_ref().map(|s| s.state.clone())
        } else {
            None
        };
        let (mut state, version) = match loaded {
            Some(stored) => {
                let state: S = super::state::decode_state(&stored, &correlation).map_err(|e| match e {
                    StateError::Unsupported(chain) => Failure::Version {
                        reason: super::reasons::UNSUPPORTED_STATE_VERSION,
                        handler: Some(self.name),
                        chain,
                    },
                    StateError::Corrupt(chain) => self.permanent(chain.join(": ")),
                })?;
                (state, Some(stored.version))
            }
            None if self.role == Role::Start => (S::default(), None),
            None => return self.instance_not_found(message, correlation, completed, ctx).await,
        };
        let mut frame = Frame {
            saga_type: S::NAME,
            correlation: correlation.clone(),
            is_new: version.is_none(),
            completed_before,
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
        ctx.tally_saga(tally(S::NAME, &frame, timeout_id.is_some(), ctx.received(), now));
        ctx.observe_saga(|| SagaEffects {
            saga_type: S::NAME,
            correlation: correlation.clone(),
            completed: frame.completed,
            requested: frame
                .timeouts
                .iter()
                .map(|t| RequestedTimeout {
                    id: t.id.clone(),
                    key: t.key.clone(),
                    due: t.due,
                    envelope: t.envelope.clone(),
                })
                .collect(),
            cancelled: frame.cancelled.clone(),
            cancelled_keys: frame.cancelled_keys.clone(),
            fired: timeout_id.clone(),
            discarded: None,
            before,
            after: Some(json.clone()),
        });
        let Some(work) = ctx.unit_of_work_mut() else {
            return Err(self.permanent("the saga's transaction went away".into()));
        };
        if !frame.completed
            && !frame.properties.is_empty()
            && let Some((property, holder)) = work
                .set_saga_properties(S::NAME, &correlation, &frame.properties)
                .await
                .map_err(store_error)?
        {
            let value = frame
                .properties
                .iter()
                .find(|(n, _)| *n == property)
                .map(|(_, v)| v.as_str())
                .unwrap_or_default();
            return Err(self.permanent(format!(
                "saga {} instance {correlation:?} set its correlation property {property} = {value:?}, which \
                 instance {holder:?} holds: a value finds one instance",
                S::NAME
            )));
        }
        if frame.completed {
            let archive = self.shared.options.completion == Completion::Archive;
            work.complete_saga(S::NAME, &correlation, &json, S::VERSION, version, archive, now)
                .await
                .map_err(store_error)?;
            if let Some((retention, _)) = self.shared.options.remember_completed {
                let kept = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
                let expires = now.checked_add_signed(kept).unwrap_or(DateTime::<Utc>::MAX_UTC);
                work.mark_saga_completed(S::NAME, &correlation, now, expires)
                    .await
                    .map_err(store_error)?;
            }
            return Ok(());
        }
        work.save_saga(S::NAME, &correlation, &json, S::VERSION, version, now)
            .await
            .map_err(store_error)?;
        work.cancel_timeouts(&frame.cancelled).await.map_err(store_error)?;
        // Before the new ones: a timeout requested under a key replaces the stored one.
        work.cancel_timeout_keys(S::NAME, &correlation, &frame.cancelled_keys)
            .await
            .map_err(store_error)?;
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

/// What a saga handler did to its instance (`frame`), for the metrics; `fired` when the
/// message was one of its timeouts.
fn tally(
    saga: &'static str,
    frame: &Frame,
    fired: bool,
    message: &crate::message::ReceivedMessage,
    now: DateTime<Utc>,
) -> SagaTally {
    let replaced = |key: &String| frame.timeouts.iter().any(|t| t.key.as_ref() == Some(key));
    let cancelled = frame.cancelled.len() + frame.cancelled_keys.iter().filter(|k| !replaced(k)).count();
    let fired_late = fired.then(|| {
        let due = match message.envelope.properties.get(headers::TIMEOUT_DUE) {
            Some(PropertyValue::String(text)) => DateTime::parse_from_rfc3339(text)
                .map(|d| d.with_timezone(&Utc))
                .unwrap_or(message.broker.enqueued_time),
            _ => message.broker.enqueued_time,
        };
        crate::endpoint::metrics::seconds_between(due, now)
    });
    SagaTally {
        saga,
        started: frame.is_new,
        completed: frame.completed,
        // A completed instance's timeouts are dropped with it: never stored.
        requested: if frame.completed {
            0
        } else {
            frame.timeouts.len() as u64
        },
        cancelled: cancelled as u64,
        fired_late,
    }
}

impl<S: Saga, M: Message> ErasedHandler for SagaHandler<S, M> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn saga(&self) -> Option<&'static str> {
        Some(S::NAME)
    }

    fn call<'a>(&'a self, ctx: &'a mut Context) -> BoxFuture<'a, Result<(), Failure>> {
        let span = otel::saga_span(S::NAME, self.name, self.role == Role::Timeout);
        Box::pin(otel::in_span(span, self.run(ctx)))
    }
}
