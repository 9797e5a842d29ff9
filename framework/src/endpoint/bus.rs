//! Sending and publishing typed messages: the [`Bus`] (outside handlers) and the
//! dispatch of what a handler's [`Context`](crate::Context) collected.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::clock::{Clock, SystemClock};
use crate::endpoint::handler::Message;
use crate::endpoint::otel;
use crate::endpoint::routing::Routes;
use crate::endpoint::trace::{TRACEPARENT, TraceContext};
use crate::entity::{TopicOptions, validate_name};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, Properties, PropertyValue};
use crate::transport::{Sender, SenderOptions, Transport};

/// How one message is sent: destination override, message id, headers, delivery time.
///
/// Given to the `_with` form of each way to send: [`Context::send_with`] and
/// [`Context::publish_with`] in a handler (sagas' contexts too), [`Bus::send_with`] and
/// [`Bus::publish_with`] outside handlers, and
/// [`TestEndpoint::send_with`](crate::testing::TestEndpoint::send_with) in tests. Each
/// option is a builder method; the fields are public to read them back.
///
/// [`Context::send_with`]: crate::Context::send_with
/// [`Context::publish_with`]: crate::Context::publish_with
///
/// # Examples
///
/// A handler that sends a reminder to be delivered in 30 minutes, with a header and a
/// message id of its own, and the test that sees it:
///
/// ```
/// use std::time::Duration;
/// use courier::prelude::*;
/// use courier::testing::TestEndpoint;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, courier::Message)]
/// struct PlaceOrder { id: String }
/// #[derive(Serialize, Deserialize, courier::Message)]
/// struct RemindCustomer { order: String }
///
/// #[courier::handler]
/// async fn place(msg: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
///     let options = SendOptions::new()
///         .deliver_after(Duration::from_secs(30 * 60))   // or deliver_at(time)
///         .header("tenant", "acme")                      // an application property
///         .message_id(format!("remind-{}", msg.id));     // receivers deduplicate by it
///     ctx.send_with(&RemindCustomer { order: msg.id }, options)?;
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let routes = Routes::new().send::<RemindCustomer>("mailer");
/// let t = TestEndpoint::start("orders", |e| e.routes(routes).handler(place)).await?;
/// t.send(&PlaceOrder { id: "o-1".into() }).await?;
///
/// let sent = &t.messages().await?[0];
/// assert_eq!(sent.destination, "mailer");
/// assert_eq!(sent.envelope.message_id, "remind-o-1");
/// assert_eq!(sent.envelope.scheduled_enqueue_time, Some(t.now() + chrono::Duration::minutes(30)));
/// t.shutdown().await?;
/// # Ok(())
/// # }
/// ```
///
/// Other options: [`to`](Self::to) (another queue than the routed one),
/// [`session_id`](Self::session_id), [`time_to_live`](Self::time_to_live).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SendOptions {
    /// Send to this queue instead of the routed one.
    pub destination: Option<String>,
    /// Use this message id instead of a new UUIDv7 (receivers deduplicate by it).
    pub message_id: Option<String>,
    /// Headers (application properties) to set.
    pub headers: Properties,
    /// Deliver at this time instead of now.
    pub deliver_at: Option<DateTime<Utc>>,
    /// Deliver after this delay instead of now (from the clock's now at dispatch time).
    pub deliver_after: Option<Duration>,
    /// Session (ordered group) of the message.
    pub session_id: Option<String>,
    /// Time-to-live of the message.
    pub time_to_live: Option<Duration>,
}

impl SendOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sends to `queue` instead of the routed queue.
    #[must_use]
    pub fn to(mut self, queue: impl Into<String>) -> Self {
        self.destination = Some(queue.into());
        self
    }
    /// Sets the message id.
    #[must_use]
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }
    /// Sets a header.
    #[must_use]
    pub fn header(mut self, key: impl Into<String>, value: impl Into<PropertyValue>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }
    /// Delivers at `at`.
    #[must_use]
    pub fn deliver_at(mut self, at: DateTime<Utc>) -> Self {
        self.deliver_at = Some(at);
        self
    }
    /// Delivers after `delay`.
    #[must_use]
    pub fn deliver_after(mut self, delay: Duration) -> Self {
        self.deliver_after = Some(delay);
        self
    }
    /// Sets the session id.
    #[must_use]
    pub fn session_id(mut self, id: impl Into<String>) -> Self {
        self.session_id = Some(id.into());
        self
    }
    /// Sets the time-to-live.
    #[must_use]
    pub fn time_to_live(mut self, ttl: Duration) -> Self {
        self.time_to_live = Some(ttl);
        self
    }
}

/// Whether a message is a command (to one queue) or an event (to a topic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    Send,
    Publish,
}

/// A message ready to leave, with where it goes.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub(crate) destination: String,
    pub(crate) is_topic: bool,
    pub(crate) envelope: Envelope,
}

/// What an outgoing message inherits from the message being handled.
#[derive(Debug, Clone)]
pub(crate) struct Parent {
    pub(crate) message_id: String,
    pub(crate) correlation_id: Option<String>,
    pub(crate) trace: TraceContext,
}

/// Encodes and addresses one message.
pub(crate) fn prepare<M: Message>(
    routes: &Routes,
    clock: &dyn Clock,
    intent: Intent,
    message: &M,
    options: SendOptions,
    parent: Option<&Parent>,
) -> Result<Outgoing> {
    let (destination, is_topic) = match intent {
        Intent::Publish => match routes.topic_of(M::NAME) {
            Some(topic) => (topic.to_owned(), true),
            None => {
                return Err(Error::new(ErrorKind::NoRoute {
                    message_type: M::NAME.to_owned(),
                    reason: "it is not declared as an event: add Routes::event::<T>()".into(),
                }));
            }
        },
        Intent::Send => match options
            .destination
            .clone()
            .or_else(|| routes.queue_of(M::NAME).map(str::to_owned))
        {
            Some(queue) => (queue, false),
            None => {
                return Err(Error::new(ErrorKind::NoRoute {
                    message_type: M::NAME.to_owned(),
                    reason: "no queue is routed for it: add Routes::send::<T>(queue) or send with SendOptions::to"
                        .into(),
                }));
            }
        },
    };
    validate_name(&destination)?;
    let mut envelope = message.to_envelope().map_err(|e| {
        Error::with_source(
            ErrorKind::InvalidMessage {
                reason: format!("cannot encode {}", M::NAME),
            },
            e,
        )
    })?;
    if let Some(id) = options.message_id {
        envelope.message_id = id;
    }
    envelope.properties.extend(options.headers);
    // Also for a `to_envelope` written by hand: the version is the type's.
    crate::endpoint::version::stamp::<M>(&mut envelope);
    let trace = match parent {
        Some(p) => {
            envelope.correlation_id = Some(p.correlation_id.clone().unwrap_or_else(|| p.message_id.clone()));
            envelope.causation_id = Some(p.message_id.clone());
            p.trace
        }
        None => TraceContext::new_root(),
    };
    envelope
        .properties
        .insert(TRACEPARENT.to_owned(), PropertyValue::String(trace.to_string()));
    envelope.scheduled_enqueue_time = match (options.deliver_at, options.deliver_after) {
        (Some(at), _) => Some(at),
        (None, Some(delay)) => {
            let now = clock.now();
            let at = chrono::Duration::from_std(delay)
                .ok()
                .and_then(|d| now.checked_add_signed(d));
            match at {
                Some(at) => Some(at),
                None => {
                    return Err(Error::new(ErrorKind::InvalidScheduleTime {
                        time: format!("{now} + {delay:?}"),
                        reason: "it cannot be represented",
                    }));
                }
            }
        }
        (None, None) => None,
    };
    envelope.session_id = options.session_id;
    envelope.time_to_live = options.time_to_live;
    Ok(Outgoing {
        destination,
        is_topic,
        envelope,
    })
}

/// The queue or topic that a send failing with `e` did not find: the destination does not
/// exist (yet). Retried: the endpoint that receives from it may start later.
pub(crate) fn missing_destination(e: &Error) -> Option<&str> {
    match e.kind() {
        ErrorKind::EntityNotFound { path } => Some(path),
        _ => None,
    }
}

/// What a handling whose send found no queue `queue` says first: what it is, and what to
/// do.
pub(crate) fn missing_queue_text(queue: &str) -> String {
    format!(
        "the destination queue `{queue}` does not exist: create it (an endpoint creates its own queue \
         when it starts: start the endpoint that receives from `{queue}`, or create the queue with \
         Transport::create_queue or the broker's tools); the message is retried until then"
    )
}

/// Whether a send that failed with `e` will fail the same way every time, whatever
/// happens at the broker meanwhile: the error is not transient, and it is about the
/// message (its size, fields, schedule, destination name, or a capability the transport
/// lacks), not about the broker's state. A destination that does not exist (yet), a
/// closed transport and a failing broker storage are retried.
pub(crate) fn refused_for_good(e: &Error) -> bool {
    !e.is_transient()
        && matches!(
            e.kind(),
            ErrorKind::MessageTooLarge { .. }
                | ErrorKind::InvalidMessage { .. }
                | ErrorKind::InvalidScheduleTime { .. }
                | ErrorKind::InvalidEntityName { .. }
                | ErrorKind::Unsupported { .. }
        )
}

/// What an operator reads about a refused outgoing message: its type, id and
/// destination, and the transport's reason.
pub(crate) fn describe_refusal(destination: &str, is_topic: bool, envelope: &Envelope, error: &Error) -> String {
    format!(
        "outgoing message {} cannot be sent: {}",
        name_outgoing(destination, is_topic, envelope),
        error.kind()
    )
}

/// An outgoing message as an operator finds it: `type (message id id) to queue name`.
pub(crate) fn name_outgoing(destination: &str, is_topic: bool, envelope: &Envelope) -> String {
    format!(
        "{} (message id {}) to {} {destination}",
        envelope.message_type.as_deref().unwrap_or("(no type)"),
        envelope.message_id,
        if is_topic { "topic" } else { "queue" },
    )
}

/// The most outgoing messages [`describe_sent`] names.
const NAMED_AT_MOST: usize = 10;

/// What a handling's transaction sent (each as [`name_outgoing`] gives it), for a commit
/// the transport refused: which message it refused is in the transport's error.
pub(crate) fn describe_sent(sent: &[String]) -> String {
    match sent {
        [one] => format!("the handlers sent outgoing message {one}"),
        _ => {
            let mut text = format!(
                "the handlers sent {} outgoing messages, one of them refused: {}",
                sent.len(),
                sent.iter().take(NAMED_AT_MOST).cloned().collect::<Vec<_>>().join("; ")
            );
            if sent.len() > NAMED_AT_MOST {
                text.push_str(&format!("; and {} more", sent.len() - NAMED_AT_MOST));
            }
            text
        }
    }
}

/// Sends and publishes typed messages from outside a handler (a web request, a
/// startup job). Cheap to clone.
///
/// Inside a handler use the [`Context`](crate::Context) instead: what it sends leaves only
/// when the handler succeeded, and carries the correlation of the handled message.
#[derive(Clone)]
pub struct Bus {
    inner: Arc<BusInner>,
}

struct BusInner {
    transport: Arc<dyn Transport>,
    routes: Routes,
    clock: Arc<dyn Clock>,
    senders: Mutex<HashMap<String, Arc<dyn Sender>>>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("transport", &self.inner.transport.name())
            .field("routes", &self.inner.routes)
            .finish()
    }
}

impl Bus {
    /// A bus over `transport` with `routes`, on the system clock.
    pub fn new(transport: Arc<dyn Transport>, routes: Routes) -> Self {
        Self::with_clock(transport, routes, Arc::new(SystemClock))
    }

    /// A bus that reads time (for [`SendOptions::deliver_after`]) from `clock`.
    pub fn with_clock(transport: Arc<dyn Transport>, routes: Routes, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(BusInner {
                transport,
                routes,
                clock,
                senders: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The routing table.
    pub fn routes(&self) -> &Routes {
        &self.inner.routes
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.inner.transport
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Sends a command to its routed queue; returns its message id.
    ///
    /// # Errors
    /// [`ErrorKind::NoRoute`] when no queue is routed for the type; the transport's send
    /// error (see [`Error::is_transient`]).
    pub async fn send<M: Message>(&self, message: &M) -> Result<String> {
        self.send_with(message, SendOptions::default()).await
    }

    /// Sends a command with options; returns its message id.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn send_with<M: Message>(&self, message: &M, options: SendOptions) -> Result<String> {
        self.emit(Intent::Send, message, options).await
    }

    /// Publishes an event to its topic; returns its message id.
    ///
    /// # Errors
    /// [`ErrorKind::NoRoute`] when the type is not declared as an event; the transport's
    /// send error.
    pub async fn publish<M: Message>(&self, message: &M) -> Result<String> {
        self.publish_with(message, SendOptions::default()).await
    }

    /// Publishes an event with options; returns its message id.
    ///
    /// # Errors
    /// As [`publish`](Self::publish).
    pub async fn publish_with<M: Message>(&self, message: &M, options: SendOptions) -> Result<String> {
        self.emit(Intent::Publish, message, options).await
    }

    async fn emit<M: Message>(&self, intent: Intent, message: &M, options: SendOptions) -> Result<String> {
        let mut out = prepare(&self.inner.routes, &*self.inner.clock, intent, message, options, None)?;
        let span = otel::producer(&mut out, self.inner.transport.name(), otel::Operation::Send);
        self.check(&out)?;
        let id = out.envelope.message_id.clone();
        otel::instrument(self.dispatch(vec![out]), span).await?;
        Ok(id)
    }

    /// Sends a raw envelope to a queue or topic (for bridges and tests).
    ///
    /// # Errors
    /// The transport's send error.
    pub async fn send_envelope(&self, destination: &str, envelope: Envelope) -> Result<()> {
        let sender = self.sender(destination, false).await?;
        sender.send(envelope).await.map_err(Error::from)
    }

    /// Checks an outgoing message as the transport would refuse it whatever its
    /// destination ([`Transport::check_message`]), before it is stored or sent.
    pub(crate) fn check(&self, out: &Outgoing) -> Result<()> {
        self.inner.transport.check_message(&out.envelope)
    }

    /// Sends what a handler collected: one batch per destination, in the order given.
    /// The transport's name (`messaging.system` of the spans).
    pub(crate) fn system(&self) -> &'static str {
        self.inner.transport.name()
    }

    /// Sends messages a handler created, after its commit, in a `dispatch` span that links
    /// each message's `create` span.
    pub(crate) async fn dispatch_created(&self, outgoing: Vec<Outgoing>) -> Result<()> {
        if outgoing.is_empty() {
            return Ok(());
        }
        let span = otel::dispatch_span(
            self.system(),
            outgoing.iter().map(|o| (o.destination.as_str(), &o.envelope)),
        );
        otel::instrument(self.dispatch(outgoing), span).await
    }

    pub(crate) async fn dispatch(&self, outgoing: Vec<Outgoing>) -> Result<()> {
        let mut groups: Vec<(String, bool, Vec<Envelope>)> = Vec::new();
        for out in outgoing {
            match groups.iter_mut().find(|(d, _, _)| *d == out.destination) {
                Some((_, _, list)) => list.push(out.envelope),
                None => groups.push((out.destination, out.is_topic, vec![out.envelope])),
            }
        }
        for (destination, is_topic, mut envelopes) in groups {
            let sender = self.sender(&destination, is_topic).await?;
            let result = if envelopes.len() == 1 {
                match envelopes.pop() {
                    Some(one) => sender.send(one).await,
                    None => Ok(()),
                }
            } else {
                sender.send_batch(envelopes).await
            };
            result.map_err(Error::from)?;
        }
        Ok(())
    }

    /// The cached sender of a queue or topic; a topic that does not exist yet is
    /// created (publishing before any subscriber exists is not an error).
    pub(crate) async fn sender(&self, destination: &str, is_topic: bool) -> Result<Arc<dyn Sender>> {
        if let Some(s) = self.cached(destination) {
            return Ok(s);
        }
        let transport = &self.inner.transport;
        if is_topic {
            // Declared first (creating an existing topic changes nothing): a lookup of a
            // topic not there yet is an error some brokers' clients log (RabbitMQ closes the
            // channel, lapin logs it at ERROR). A failure here is met again just below.
            let _ = transport.create_topic(destination, &TopicOptions::default()).await;
        }
        let sender = match transport.sender(destination, SenderOptions::default()).await {
            Ok(s) => s,
            Err(e) if is_topic && matches!(e.kind(), ErrorKind::EntityNotFound { .. }) => {
                transport.create_topic(destination, &TopicOptions::default()).await?;
                transport.sender(destination, SenderOptions::default()).await?
            }
            Err(e) => return Err(e),
        };
        let sender = crate::endpoint::metrics::MeteredSender::wrap(sender, transport.name());
        if let Ok(mut map) = self.inner.senders.lock() {
            map.insert(destination.to_owned(), sender.clone());
        }
        Ok(sender)
    }

    fn cached(&self, destination: &str) -> Option<Arc<dyn Sender>> {
        self.inner.senders.lock().ok()?.get(destination).cloned()
    }
}
