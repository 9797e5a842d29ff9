//! One connection to RabbitMQ, re-established with backoff when it drops (to the next node
//! that answers, when the transport has several: `nodes.rs`), with the topology declared
//! again on every new connection, and its close: in an order that lets
//! the channels being closed finish first, and bounded at every step (a shutdown ends).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ChannelStatus, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::entity::QueueOptions;
use crate::error::{Error, ErrorKind, Result};

use super::nodes::{NODE_ATTEMPT, Node, Nodes, order};
use super::wire::{dead_letter_queue, subscription_queue};

/// Courier's patch of lapin (`patches/lapin/PATCH.md`: a new channel does not inherit the
/// error of a broker-closed channel that had its id) is required: without it this fails to
/// build, naming the constant, instead of opening no channel after enough 404s.
const _LAPIN_IS_PATCHED: bool = lapin::COURIER_PATCHED_CHANNEL_POISON;

/// Something declared on the broker, kept so that a new connection declares it again
/// (after a restart of a broker that lost it, nothing is missing).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Declaration {
    Queue {
        name: String,
        options: QueueOptions,
    },
    Topic {
        name: String,
    },
    Subscription {
        topic: String,
        name: String,
        options: QueueOptions,
    },
}

pub(crate) struct Connector {
    /// The nodes, their URLs with their passwords: used to connect, never logged.
    nodes: Nodes,
    /// The nodes' URLs without their passwords, for logs and errors.
    pub(crate) display: String,
    /// The node of the last connection made ([`NO_NODE`] before the first): the next
    /// connection tries it last.
    node: AtomicUsize,
    name: String,
    /// Extra root certificates (PEM) trusted for `amqps://`, beside the system's.
    tls_roots: Option<String>,
    current: Mutex<Option<Arc<Connection>>>,
    generation: AtomicU64,
    closed: AtomicBool,
    /// Cancelled by [`Connector::close`]: a connection attempt in progress (which holds
    /// `current`) gives up at once instead of making close wait for it.
    closing: CancellationToken,
    connect_timeout: Duration,
    /// The bound on one operation that waits on RabbitMQ ([`Connector::within`]).
    operation_timeout: Duration,
    topology: std::sync::Mutex<Vec<Declaration>>,
    /// The status of every channel opened on the current connection and not yet seen
    /// closed: [`Connector::close`] lets those being closed finish before it closes the
    /// connection.
    opened: std::sync::Mutex<Vec<ChannelStatus>>,
    /// Where [`Connector::close`] is ([`ClosePhase`]), for what a watchdog reports.
    phase: AtomicU8,
    /// The places that keep a channel for later use ([`Held`]).
    held: std::sync::Mutex<Vec<Weak<dyn Held>>>,
}

/// A place that keeps a channel of the connection for later use (a sender's confirm
/// channel, a receiver's consumer): [`Connector::close`] takes the channel out and closes
/// it itself before it closes the connection, so that the channel is not closed by lapin
/// later, when its holder is dropped (after an endpoint's shutdown, its tasks end a little
/// after it), while the connection closes.
pub(crate) trait Held: Send + Sync {
    /// The channel kept, taken out, with what must be dropped only once it is closed (a
    /// consumer); `None` when there is none or it is in use now (it then closes with the
    /// connection, and its holder finds it closed).
    fn take_channel(&self) -> Option<(Channel, Box<dyn std::any::Any + Send>)>;
}

impl Held for Mutex<Option<Channel>> {
    fn take_channel(&self) -> Option<(Channel, Box<dyn std::any::Any + Send>)> {
        let channel = self.try_lock().ok()?.take()?;
        Some((channel, Box::new(())))
    }
}

/// Where [`Connector::close`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ClosePhase {
    /// Not closing.
    Open = 0,
    /// Waiting for a connection attempt in progress to give up.
    Lock = 1,
    /// Waiting for RabbitMQ to confirm the channels being closed.
    Channels = 2,
    /// Waiting for RabbitMQ's `connection.close-ok`.
    CloseOk = 3,
    /// Closed.
    Done = 4,
}

impl ClosePhase {
    fn of(n: u8) -> Self {
        match n {
            1 => Self::Lock,
            2 => Self::Channels,
            3 => Self::CloseOk,
            4 => Self::Done,
            _ => Self::Open,
        }
    }
}

/// [`Connector::node`] before the first connection.
const NO_NODE: usize = usize::MAX;

/// How long [`Connector::close`] waits for the channels being closed to be confirmed.
const CHANNELS_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// How long [`Connector::close`] waits for RabbitMQ's `connection.close-ok` before it
/// drops the connection without it.
const CLOSE_OK_WAIT: Duration = Duration::from_secs(10);

/// `amqp://user:secret@host/vhost` -> `amqp://user:***@host/vhost`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<invalid url>".to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// The AMQP reply code of a broker refusal (404 not found, 406 precondition failed, ...).
pub(crate) fn reply_code(e: &lapin::Error) -> Option<u16> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(a) => Some(a.get_id()),
        _ => None,
    }
}

/// A lapin error as a transient connection failure (callers map the broker refusals they
/// expect, such as 404, by [`reply_code`] first).
pub(crate) fn connection_error(context: &str, e: &lapin::Error) -> Error {
    Error::new(ErrorKind::Connection {
        detail: format!("{context}: {e}"),
    })
}

impl Connector {
    pub(crate) fn new(nodes: Nodes, name: String, connect_timeout: Duration, tls_roots: Option<String>) -> Self {
        Self {
            display: nodes.display(),
            nodes,
            node: AtomicUsize::new(NO_NODE),
            name,
            tls_roots,
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            closing: CancellationToken::new(),
            connect_timeout,
            operation_timeout: super::DEFAULT_OPERATION_TIMEOUT,
            topology: std::sync::Mutex::new(Vec::new()),
            opened: std::sync::Mutex::new(Vec::new()),
            phase: AtomicU8::new(ClosePhase::Open as u8),
            held: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// With `bound` on each operation that waits on RabbitMQ
    /// ([`AmqpBuilder::operation_timeout`](super::AmqpBuilder::operation_timeout)).
    pub(crate) fn with_operation_timeout(mut self, bound: Duration) -> Self {
        self.operation_timeout = bound;
        self
    }

    /// The bound on one operation that waits on RabbitMQ.
    pub(crate) fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// Whether an acknowledgement (`ack`, `nack`, `reject`) was handed over within the
    /// operation timeout. lapin resolves it once written to the socket; on a connection
    /// whose node stopped answering it may never be, and the one waiting for it would
    /// wait as long (a receive loop, a settlement). Not handed over, the delivery comes
    /// back when RabbitMQ drops the connection, as after any lost lock.
    pub(crate) async fn acked<T>(&self, ack: impl Future<Output = lapin::Result<T>>) -> bool {
        matches!(tokio::time::timeout(self.operation_timeout, ack).await, Ok(Ok(_)))
    }

    /// Registers a place that keeps a channel ([`Held`]); it is forgotten once dropped.
    pub(crate) fn hold(&self, place: Weak<dyn Held>) {
        if let Ok(mut held) = self.held.lock() {
            held.retain(|w| w.strong_count() > 0);
            if !held.iter().any(|w| std::ptr::addr_eq(w.as_ptr(), place.as_ptr())) {
                held.push(place);
            }
        }
    }

    /// The first node's URL with its password: for what must read it (the management
    /// API's credentials and virtual host, which every node shares), never to show.
    pub(crate) fn url(&self) -> &str {
        self.nodes.first_url()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::new(ErrorKind::Closed));
        }
        Ok(())
    }

    /// The node of the last connection made, without its password; `None` before the
    /// first.
    pub(crate) fn connected_node(&self) -> Option<String> {
        let i = self.node.load(Ordering::Acquire);
        (i != NO_NODE).then(|| self.nodes.get(i).display.clone())
    }

    /// How many connections were made so far (the first is 1).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The live connection, or a new one. Connecting retries with backoff (50 ms doubling
    /// to 2 s) for at most the connect timeout, then fails with a transient
    /// [`ErrorKind::Connection`].
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>> {
        self.check_open()?;
        let mut current = tokio::select! {
            () = self.closing.cancelled() => return Err(Error::new(ErrorKind::Closed)),
            current = self.current.lock() => current,
        };
        if let Some(c) = current.as_ref()
            && c.status().connected()
        {
            return Ok(c.clone());
        }
        *current = None;
        if let Ok(mut opened) = self.opened.lock() {
            opened.clear();
        }
        // Closing gives up a connection attempt (connecting, declaring the topology again)
        // at once: close never waits for one.
        tokio::select! {
            () = self.closing.cancelled() => Err(Error::new(ErrorKind::Closed)),
            made = self.reconnect() => {
                let connection = made?;
                *current = Some(connection.clone());
                Ok(connection)
            }
        }
    }

    /// Connects with backoff for at most the connect timeout and declares the topology
    /// again on the new connection. With several nodes, a round tries each once, in the
    /// [`order`] that puts the node lost last, each attempt bounded by [`NODE_ATTEMPT`];
    /// the backoff is between rounds.
    async fn reconnect(&self) -> Result<Arc<Connection>> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let mut backoff = Duration::from_millis(50);
        let several = self.nodes.len() > 1;
        loop {
            let lost = Some(self.node.load(Ordering::Acquire)).filter(|&i| i != NO_NODE);
            let mut failures = Vec::new();
            for i in order(self.nodes.len(), lost) {
                self.check_open()?;
                let node = self.nodes.get(i);
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let bound = if several { left.min(NODE_ATTEMPT) } else { left };
                match self.attempt(node, deadline, bound).await? {
                    Ok(connection) => {
                        let connection = Arc::new(connection);
                        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                        let previous = self.node.swap(i, Ordering::AcqRel);
                        if generation > 1 {
                            tracing::info!(broker = %node.display, generation, "reconnected to RabbitMQ");
                            crate::endpoint::metrics::reconnected("amqp");
                        }
                        if several && previous != i {
                            tracing::info!(node = %node.display, "connected to this RabbitMQ node of the cluster");
                        }
                        return Ok(connection);
                    }
                    Err(failure) if several => failures.push(format!("{}: {failure}", node.display)),
                    Err(failure) => failures.push(failure),
                }
            }
            let failure = failures.join("; ");
            if tokio::time::Instant::now() + backoff > deadline {
                return Err(Error::new(ErrorKind::Connection {
                    detail: format!(
                        "cannot connect to {} within {:?}: {failure}",
                        self.display, self.connect_timeout
                    ),
                }));
            }
            tracing::warn!(broker = %self.display, error = %failure, retry_in = ?backoff, "cannot connect to RabbitMQ");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// One attempt on `node`: connecting within `bound`, then declaring the topology again
    /// before `deadline`. `Ok(Err(..))` says why it failed, to try again; `Err` is a
    /// refusal that no attempt will change.
    async fn attempt(
        &self,
        node: &Node,
        deadline: tokio::time::Instant,
        bound: Duration,
    ) -> Result<std::result::Result<Connection, String>> {
        let properties = ConnectionProperties::default().with_connection_name(LongString::from(self.name.as_bytes()));
        let failure = match tokio::time::timeout(bound, self.connect(&node.url, properties)).await {
            Ok(Ok(connection)) => {
                // Bounded like the connecting: a broker that stops answering while the
                // topology is declared again is a failed attempt, not a wait without end.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match tokio::time::timeout(left, self.redeclare(&connection)).await {
                    Ok(Ok(())) => return Ok(Ok(connection)),
                    Ok(Err(e)) => {
                        close_within(&connection, CLOSE_OK_WAIT, 200, "redeclaring failed").await;
                        e.to_string()
                    }
                    Err(_) => {
                        close_within(&connection, CLOSE_OK_WAIT, 200, "redeclaring timed out").await;
                        "declaring the topology again timed out".to_owned()
                    }
                }
            }
            // A refused login (403 ACCESS_REFUSED) or a virtual host the user may not
            // open (530 NOT_ALLOWED) is the broker's answer, not a network failure:
            // trying again for the rest of the timeout cannot help (the nodes of a
            // cluster share their users and virtual hosts).
            Ok(Err(e)) if matches!(reply_code(&e), Some(403 | 530)) => {
                return Err(Error::new(ErrorKind::InvalidOptions {
                    reason: format!(
                        "RabbitMQ at {} refused the connection: {e}; check the user, password and virtual host \
                         in the URL (and the user's permissions on the virtual host)",
                        node.display
                    ),
                }));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        Ok(Err(failure))
    }

    async fn connect(
        &self,
        url: &str,
        properties: ConnectionProperties,
    ) -> std::result::Result<Connection, lapin::Error> {
        match &self.tls_roots {
            None => Connection::connect(url, properties).await,
            Some(pem) => {
                let tls = lapin::tcp::OwnedTLSConfig {
                    identity: None,
                    cert_chain: Some(pem.clone()),
                };
                let runtime = lapin::runtime::default_runtime()?;
                Connection::connect_with_config(url, properties, tls, runtime).await
            }
        }
    }

    /// A new channel on the live connection. A connection that fails while the channel
    /// opens (RabbitMQ closed it a moment before: a connection-level error) is replaced
    /// once, and the channel opened on the new one.
    pub(crate) async fn channel(&self) -> Result<Channel> {
        let connection = self.connection().await?;
        let channel = match connection.create_channel().await {
            Ok(channel) => channel,
            Err(e) if !connection.status().connected() => {
                tracing::info!(broker = %self.display, error = %e, "the connection failed as a channel opened: connecting again");
                self.connection()
                    .await?
                    .create_channel()
                    .await
                    .map_err(|e| connection_error("cannot open a channel", &e))?
            }
            Err(e) => return Err(connection_error("cannot open a channel", &e)),
        };
        if let Ok(mut opened) = self.opened.lock() {
            // Those seen closed are forgotten: the list stays as long as the channels open.
            opened.retain(|s| s.connected() || s.closing() || s.initializing());
            opened.push(channel.status().clone());
        }
        Ok(channel)
    }

    /// Runs `f` on a channel of its own and closes the channel after it, on a task of its
    /// own: a caller that stops waiting (a dropped future) never cuts `f` short.
    ///
    /// Why a task: an operation the broker refuses (a passive declare's 404, a 406) makes
    /// RabbitMQ close the channel, and lapin answers with `channel.close-ok`. A
    /// `channel.close` of Courier's that lapin queues just after that answer reaches
    /// RabbitMQ on a channel it no longer has, and RabbitMQ closes the whole connection
    /// (504 `CHANNEL_ERROR - expected 'channel.open'`), failing every channel on it. Closing
    /// only once `f` has its answer rules that out: lapin hands `f` a refusal only after
    /// it answered the broker's close, and the channel is then seen closed.
    pub(crate) async fn on_own_channel<T, F, Fut>(&self, f: F) -> Result<std::result::Result<T, lapin::Error>>
    where
        T: Send + 'static,
        F: FnOnce(Channel) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = std::result::Result<T, lapin::Error>> + Send + 'static,
    {
        let channel = self.channel().await?;
        let task = tokio::spawn(async move {
            let out = f(channel.clone()).await;
            if channel.status().connected() {
                let _ = channel.close(200, "done".into()).await;
            }
            out
        });
        task.await.map_err(|e| {
            Error::new(ErrorKind::Connection {
                detail: format!("an operation on a RabbitMQ channel stopped: {e}"),
            })
        })
    }

    /// A passive declare of `queue` ([`on_own_channel`](Self::on_own_channel)): its
    /// counts, or RabbitMQ's refusal (404 when there is no such queue).
    pub(crate) async fn passive_declare(&self, queue: &str) -> Result<std::result::Result<lapin::Queue, lapin::Error>> {
        let queue = queue.to_owned();
        self.on_own_channel(|c| async move {
            c.queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
        })
        .await
    }

    /// Remembers a declaration, to be made again on every new connection.
    pub(crate) fn remember(&self, d: Declaration) {
        if let Ok(mut t) = self.topology.lock()
            && !t.contains(&d)
        {
            t.push(d);
        }
    }

    /// What was declared so far.
    pub(crate) fn declared(&self) -> Vec<Declaration> {
        self.topology.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Forgets the declarations of a deleted queue or topic.
    pub(crate) fn forget(&self, queue_or_topic: &str) {
        if let Ok(mut t) = self.topology.lock() {
            t.retain(|d| match d {
                Declaration::Queue { name, .. } | Declaration::Topic { name } => name != queue_or_topic,
                Declaration::Subscription { topic, name, .. } => {
                    topic != queue_or_topic && subscription_queue(topic, name) != queue_or_topic
                }
            });
        }
    }

    async fn redeclare(&self, connection: &Connection) -> std::result::Result<(), lapin::Error> {
        let declarations = self.topology.lock().map(|t| t.clone()).unwrap_or_default();
        if declarations.is_empty() {
            return Ok(());
        }
        let mut channel = connection.create_channel().await?;
        for d in &declarations {
            // A redeclaration that the broker refuses (406: the entity exists with other
            // settings) closes the channel; the entity is there, which is what counts.
            if let Err(e) = declare(&channel, d).await {
                tracing::debug!(declaration = ?d, error = %e, "redeclaration refused");
                if !channel.status().connected() {
                    channel = connection.create_channel().await?;
                }
            }
        }
        let _ = channel.close(200, "redeclared".into()).await;
        Ok(())
    }

    /// Closes the connection; every later call fails with [`ErrorKind::Closed`].
    ///
    /// In this order, each step bounded, so that a close ends and logs nothing from lapin:
    /// a connection attempt in progress gives up; the channels whose last handle was just
    /// dropped (a receiver's, a sender's, at the shutdown of an endpoint) finish closing,
    /// since lapin closes such a channel later, on its own task, and one it closes after
    /// the connection began to close fails and puts the whole connection in error
    /// (`ERROR lapin::channels: Connection error invalid channel state: Closing`); then
    /// the connection closes, waiting at most [`CLOSE_OK_WAIT`] for RabbitMQ's answer.
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.closing.cancel();
        self.set_phase(ClosePhase::Lock);
        let current = self.current.lock().await.take();
        if let Some(c) = current {
            self.set_phase(ClosePhase::Channels);
            self.let_channels_close(&c).await;
            self.set_phase(ClosePhase::CloseOk);
            close_within(&c, CLOSE_OK_WAIT, 200, "closed by the application").await;
        }
        self.set_phase(ClosePhase::Done);
    }

    fn set_phase(&self, phase: ClosePhase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// Where [`Connector::close`] is, and the state of the connection: what a watchdog
    /// reports when a close takes too long.
    pub(crate) fn close_progress(&self) -> String {
        let phase = ClosePhase::of(self.phase.load(Ordering::Acquire));
        let connection = match self.current.try_lock() {
            Ok(c) => match c.as_ref() {
                Some(c) => describe(c),
                None => "none".to_owned(),
            },
            Err(_) => "locked (a connection attempt or the close holds it)".to_owned(),
        };
        let channels = self
            .opened
            .lock()
            .map_or(0, |o| o.iter().filter(|s| s.closing()).count());
        format!("close phase {phase:?}; connection {connection}; {channels} channel(s) closing")
    }

    /// Closes the channels kept for later use ([`Held`]) and lets lapin finish closing
    /// those dropped just before: a round trip through lapin's command queue and the
    /// broker (a channel opened and closed) makes sure the close of every channel dropped
    /// before it has begun, then the wait is for RabbitMQ's `channel.close-ok` of those
    /// being closed. Bounded by [`CHANNELS_CLOSE_WAIT`]; channels in use now close with
    /// the connection.
    async fn let_channels_close(&self, connection: &Connection) {
        let settle = async {
            let held: Vec<Arc<dyn Held>> = self
                .held
                .lock()
                .map(|h| h.iter().filter_map(Weak::upgrade).collect())
                .unwrap_or_default();
            for place in held {
                if let Some((channel, after)) = place.take_channel() {
                    if channel.status().connected() {
                        let _ = channel.close(200, "OK".into()).await;
                    }
                    drop(after);
                }
            }
            if let Ok(barrier) = connection.create_channel().await {
                let _ = barrier.close(200, "OK".into()).await;
            }
            loop {
                let closing = self.opened.lock().is_ok_and(|o| o.iter().any(ChannelStatus::closing));
                if !closing || !connection.status().connected() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        if tokio::time::timeout(CHANNELS_CLOSE_WAIT, settle).await.is_err() {
            tracing::warn!(
                broker = %self.display,
                "RabbitMQ did not confirm the close of every channel within {} s; the connection is closed anyway",
                CHANNELS_CLOSE_WAIT.as_secs()
            );
        }
    }

    /// Drops the connection as a network failure would (tests of recovery use it).
    pub(crate) async fn sever(&self) {
        let current = self.current.lock().await.take();
        if let Some(c) = current {
            close_within(&c, CLOSE_OK_WAIT, 320, "severed").await;
        }
    }
}

/// Closes `channel` on a task of its own if it is still open: what lapin does when the
/// last handle of a channel drops, but as Courier's own call, whose failure (the
/// connection closing meanwhile) comes back here instead of putting the connection in
/// error and being logged by lapin at ERROR. Without a runtime, lapin does it.
pub(crate) fn close_later(channel: Channel) {
    if !channel.status().connected() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = channel.close(200, "OK".into()).await;
        });
    }
}

/// Closes `connection` with `code`, waiting at most `wait` for RabbitMQ's `connection.close-ok`;
/// past it the connection is dropped without it (its socket closes with the last handle)
/// and a warning says what was waited for.
async fn close_within(connection: &Connection, wait: Duration, code: u16, reason: &str) {
    if !connection.status().connected() {
        return;
    }
    if tokio::time::timeout(wait, connection.close(code, reason.into()))
        .await
        .is_err()
    {
        tracing::warn!(
            connection = %describe(connection),
            "RabbitMQ did not confirm the close of the connection within {} s; it is dropped without it",
            wait.as_secs()
        );
    }
}

/// The state of a connection, in words.
fn describe(c: &Connection) -> String {
    let s = c.status();
    let state = if s.connected() {
        "connected"
    } else if s.closing() {
        "closing"
    } else if s.closed() {
        "closed"
    } else if s.errored() {
        "in error"
    } else if s.connecting() || s.reconnecting() {
        "connecting"
    } else {
        "unknown"
    };
    if s.blocked() {
        format!("{state}, blocked by the broker (a resource alarm)")
    } else {
        state.to_owned()
    }
}

/// The arguments of a Courier queue: quorum (durable, replicated, with a durable delivery
/// count), the delivery limit, dead-lettering into `queue::dlq` at least once.
fn queue_arguments(queue: &str, options: &QueueOptions) -> FieldTable {
    queue_arguments_into(&dead_letter_queue(queue), options)
}

/// [`queue_arguments`] dead-lettering into `dlq` (a session queue's partitions share the
/// session queue's).
pub(crate) fn queue_arguments_into(dlq: &str, options: &QueueOptions) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    // RabbitMQ dead-letters a message returned more often than the limit: with limit
    // n - 1, the n-th failed delivery is the last one.
    let limit = i64::from(options.max_delivery_count.saturating_sub(1));
    args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
    args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
    args.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(dlq.into()));
    args.insert(
        "x-dead-letter-strategy".into(),
        AMQPValue::LongString("at-least-once".into()),
    );
    args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
    if let Some(ttl) = options.default_time_to_live {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms));
    }
    args
}

fn quorum() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    args
}

/// Declares a queue's dead-letter queue alone (a quorum queue, durable).
pub(crate) async fn declare_dead_letter_queue(channel: &Channel, dlq: &str) -> std::result::Result<(), lapin::Error> {
    channel
        .queue_declare(dlq.into(), QueueDeclareOptions::durable(), quorum())
        .await
        .map(drop)
}

async fn declare_queue(
    channel: &Channel,
    queue: &str,
    options: &QueueOptions,
) -> std::result::Result<(), lapin::Error> {
    let dlq = dead_letter_queue(queue);
    channel
        .queue_declare(dlq.as_str().into(), QueueDeclareOptions::durable(), quorum())
        .await?;
    if options.requires_session {
        // A session queue is its partitions (`sessions.rs`); there is no queue `queue`.
        for partition in super::sessions::partition_queues(queue) {
            channel
                .queue_declare(
                    partition.as_str().into(),
                    QueueDeclareOptions::durable(),
                    super::sessions::partition_arguments(queue, options),
                )
                .await?;
        }
        return Ok(());
    }
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::durable(),
            queue_arguments(queue, options),
        )
        .await?;
    Ok(())
}

/// Declares `d` on `channel` (a refusal closes the channel).
pub(crate) async fn declare(channel: &Channel, d: &Declaration) -> std::result::Result<(), lapin::Error> {
    match d {
        Declaration::Queue { name, options } => declare_queue(channel, name, options).await,
        Declaration::Topic { name } => {
            let options = ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            };
            channel
                .exchange_declare(
                    name.as_str().into(),
                    ExchangeKind::Fanout,
                    options,
                    FieldTable::default(),
                )
                .await
        }
        Declaration::Subscription { topic, name, options } => {
            let queue = subscription_queue(topic, name);
            declare_queue(channel, &queue, options).await?;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    topic.as_str().into(),
                    "".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact("amqps://app:s3cret@rabbit.example:5671/prod"),
            "amqps://app:***@rabbit.example:5671/prod"
        );
        assert_eq!(redact("amqp://127.0.0.1:5672"), "amqp://127.0.0.1:5672");
        assert_eq!(redact("nonsense"), "<invalid url>");
    }
}
