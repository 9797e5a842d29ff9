//! The builder of [`AmqpTransport`]: the nodes, the clock, the schedule store, and the
//! bounds on connecting and on each operation that waits on RabbitMQ.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::checks::DEFAULT_MAX_MESSAGE_SIZE;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, ErrorKind, Result};

use super::conn::{self, Connector};
use super::inspect::WireCounters;
use super::publish::ConfirmChannel;
use super::{
    AmqpTransport, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OPERATION_TIMEOUT, Inner, ScheduleStore, dispatcher, nodes, seal,
    sessions,
};

/// Builds an [`AmqpTransport`].
#[must_use]
pub struct AmqpBuilder {
    /// The URLs of the nodes, as given ([`AmqpBuilder::nodes`]).
    urls: Vec<String>,
    clock: Arc<dyn Clock>,
    schedules: Option<ScheduleStore>,
    max_message_size: usize,
    connect_timeout: Duration,
    operation_timeout: Duration,
    connection_name: String,
    tls_roots: Option<String>,
}

impl std::fmt::Debug for AmqpBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpBuilder")
            .field("urls", &self.urls.iter().map(|u| conn::redact(u)).collect::<Vec<_>>())
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .finish_non_exhaustive()
    }
}

impl AmqpBuilder {
    pub(super) fn new(url: String) -> Self {
        AmqpBuilder {
            urls: vec![url],
            clock: Arc::new(SystemClock),
            schedules: None,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            connection_name: "courier".to_owned(),
            tls_roots: None,
        }
    }

    /// The nodes of a RabbitMQ cluster to connect to, replacing the builder's URL: each URL
    /// names one node or several (`amqp://user:password@h1:5672,h2:5672/%2f`, as the URL
    /// of [`AmqpTransport::builder`](super::AmqpTransport::builder) may). The transport
    /// connects to one; when that connection is lost it connects to the next one that
    /// answers, with the same backoff, connect timeout and guarantees as a reconnect to a
    /// single node (see docs/rabbitmq-cluster.md). With several nodes, one attempt on
    /// one node takes at most 5 s, so that a node that accepts connections and never
    /// answers leaves time for the others.
    ///
    /// The nodes share their virtual host; a bad list makes [`open`](Self::open) fail
    /// with [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) saying what
    /// to write.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> courier::Result<()> {
    /// use courier::AmqpTransport;
    /// let rabbit = AmqpTransport::builder("amqp://app:secret@rabbit-1:5672/%2f")
    ///     .nodes(["amqp://app:secret@rabbit-1:5672/%2f", "amqp://app:secret@rabbit-2:5672,rabbit-3:5672/%2f"])
    ///     .open()
    ///     .await?;
    /// # let _ = rabbit; Ok(()) }
    /// ```
    pub fn nodes<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.urls = urls.into_iter().map(Into::into).collect();
        self
    }

    /// The clock for enqueued times, time-to-live and scheduled messages.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Where scheduled messages wait until due (needed for [`Sender::schedule`](crate::Sender::schedule), delayed
    /// retries and `send_at`/`send_after`); usually the endpoint's store.
    pub fn schedules(mut self, store: impl Into<ScheduleStore>) -> Self {
        self.schedules = Some(store.into());
        self
    }

    /// The largest message accepted (default [`DEFAULT_MAX_MESSAGE_SIZE`]).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// How long connecting may take before a call fails (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]); reconnecting after a drop waits as long.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How long one operation that waits on RabbitMQ may take (default
    /// [`DEFAULT_OPERATION_TIMEOUT`]): a publish until its confirm (a send, a dead-letter
    /// copy, a due scheduled message, a resubmit), an acknowledgement until lapin has
    /// written it. Past it the operation fails with a transient
    /// [`ErrorKind::Connection`] whose outcome is unknown, and the channel it waited on is
    /// closed (the next operation opens another). A node that stops answering without
    /// closing its connections (paused, or cut off by the network) is noticed by the
    /// heartbeat (`?heartbeat=N` in the URL: after about two heartbeats); this bound is
    /// for what is in flight at that moment, and for a broker that holds a confirm back
    /// (a memory or disk alarm blocks publishers until it clears). A send that fails
    /// this way may have arrived: send it again with the same message id, and the
    /// receiving endpoint's inbox drops the duplicate.
    pub fn operation_timeout(mut self, d: Duration) -> Self {
        self.operation_timeout = d;
        self
    }

    /// Root certificates (PEM) to trust for `amqps://` besides the system's: a private
    /// certificate authority.
    pub fn tls_root_certificates(mut self, pem: impl Into<String>) -> Self {
        self.tls_roots = Some(pem.into());
        self
    }

    /// The connection name shown in RabbitMQ's management UI.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// Connects.
    ///
    /// # Errors
    /// [`ErrorKind::Connection`] (transient) when RabbitMQ cannot be reached within the
    /// connect timeout; the error names the URL without its password.
    /// [`ErrorKind::InvalidOptions`] when a URL or the list of nodes cannot be read.
    pub async fn open(self) -> Result<AmqpTransport> {
        let nodes =
            nodes::Nodes::parse(&self.urls).map_err(|reason| Error::new(ErrorKind::InvalidOptions { reason }))?;
        let inner = Arc::new(Inner {
            conn: Connector::new(nodes, self.connection_name, self.connect_timeout, self.tls_roots)
                .with_operation_timeout(self.operation_timeout),
            clock: self.clock,
            schedules: self.schedules.clone(),
            max_message_size: self.max_message_size,
            wake: Notify::new(),
            internal: ConfirmChannel::default(),
            stop: CancellationToken::new(),
            wire: WireCounters::default(),
            seal_keys: seal::Keys::default(),
            sessions: sessions::Hubs::default(),
        });
        inner.conn.connection().await?;
        if let Some(store) = self.schedules {
            tokio::spawn(dispatcher(inner.clone(), store));
        }
        Ok(AmqpTransport { inner })
    }
}
