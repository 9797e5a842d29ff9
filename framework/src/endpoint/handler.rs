//! What `#[derive(Message)]` and `#[handler]` implement: the [`Message`] and [`Handler`]
//! traits, and the [`HandlerError`] a handler returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{CodecError, JsonCodec};
use crate::endpoint::context::Context;
use crate::endpoint::version::UpcastError;
use crate::error::BoxError;
use crate::message::Envelope;

/// A boxed future, as handlers return them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A message type: a serde type with a stable wire name.
///
/// Derive it: `#[derive(Serialize, Deserialize, courier::Message)]`. The wire name is
/// what travels in [`Envelope::message_type`] and what a receiving endpoint looks its
/// handlers up by, so it must not change while messages of the type are in queues. By
/// default it is the Rust path (`my_crate::billing::InvoicePaid`); pin it with
/// `#[message(name = "billing.InvoicePaid")]` before the first message is sent, and list
/// the names a type had before with `#[message(aliases = ["old.Name"])]`, so that
/// messages sent under an earlier name are still handled after a rename. A message whose
/// name no handler knows is dead-lettered with the reason
/// [`UNKNOWN_MESSAGE_TYPE`](crate::recoverability::reasons::UNKNOWN_MESSAGE_TYPE), never dropped.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Courier message",
    label = "not a message type",
    note = "add `#[derive(serde::Serialize, serde::Deserialize, courier::Message)]` to the type"
)]
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stable wire name.
    const NAME: &'static str;
    /// Earlier wire names of this type, still accepted on receive.
    const ALIASES: &'static [&'static str] = &[];
    /// The current version of the type's wire shape (`#[message(version = 3)]`; default
    /// 1). Senders write it in the header
    /// [`MESSAGE_VERSION`](crate::version::headers::MESSAGE_VERSION) when it is above 1;
    /// a receiver runs [`upcast`](Self::upcast) on the body of an older message, and
    /// dead-letters a newer one with the reason
    /// [`UNSUPPORTED_MESSAGE_VERSION`](crate::recoverability::reasons::UNSUPPORTED_MESSAGE_VERSION).
    const VERSION: u32 = 1;

    /// Brings a body of version `from` to version `from + 1`; the receiver calls it for
    /// each version from the one the message has up to [`VERSION`](Self::VERSION) - 1, in
    /// order, then decodes the result. The body is a `serde_json::Value` whatever the
    /// codec (see [`body_value`](Self::body_value)). Set it with
    /// `#[message(version = 3, upcast = Self::upcast)]`. The default has no step: an
    /// older message is dead-lettered.
    ///
    /// # Errors
    /// [`UpcastError::Unsupported`] for a version it has no step from (the message is
    /// dead-lettered with
    /// [`UNSUPPORTED_MESSAGE_VERSION`](crate::recoverability::reasons::UNSUPPORTED_MESSAGE_VERSION));
    /// [`UpcastError::Invalid`] for a body without the expected shape (dead-lettered with
    /// [`DESERIALIZATION_FAILED`](crate::recoverability::reasons::DESERIALIZATION_FAILED)).
    fn upcast(from: u32, body: serde_json::Value) -> Result<serde_json::Value, UpcastError> {
        let _ = body;
        Err(UpcastError::unsupported(from))
    }

    /// Encodes the message into an envelope with a new message id, its content type, its
    /// wire name and, above version 1, its version. The default encodes JSON.
    ///
    /// # Errors
    /// The codec's error if the value cannot be encoded.
    fn to_envelope(&self) -> Result<Envelope, CodecError> {
        let mut envelope = Envelope::json(self)?.with_message_type(Self::NAME);
        crate::endpoint::version::stamp::<Self>(&mut envelope);
        Ok(envelope)
    }

    /// Decodes the message from an envelope's body. The default reads JSON.
    ///
    /// # Errors
    /// [`CodecError`] if the body is not a valid value of this type.
    fn from_envelope(envelope: &Envelope) -> Result<Self, CodecError> {
        envelope.decode(&JsonCodec)
    }

    /// Decodes the body of an older version into a `serde_json::Value` for
    /// [`upcast`](Self::upcast). The default reads JSON; with `#[message(codec = C)]` the
    /// codec `C` decodes it, which works for self-describing formats (MessagePack, CBOR)
    /// and fails for those that need the type to read (bincode): such a message is
    /// dead-lettered with
    /// [`DESERIALIZATION_FAILED`](crate::recoverability::reasons::DESERIALIZATION_FAILED).
    ///
    /// # Errors
    /// [`CodecError`] if the body is not a valid value.
    fn body_value(envelope: &Envelope) -> Result<serde_json::Value, CodecError> {
        envelope.decode(&JsonCodec)
    }
}

/// A handler of one message type. `#[courier::handler]` implements it for a plain
/// `async fn(message: T, ctx: &mut Context) -> Result<(), E>`; implement it by hand for a
/// handler that carries its own data.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Courier handler",
    note = "put `#[courier::handler]` on an `async fn(message: T, ctx: &mut courier::Context) -> Result<(), E>`"
)]
pub trait Handler: Send + Sync + 'static {
    /// The message type handled.
    type Message: Message;

    /// The handler's name in logs and in the failure details of a dead-lettered message.
    fn name(&self) -> &'static str;

    /// Handles one message.
    fn handle<'a>(&'a self, message: Self::Message, ctx: &'a mut Context) -> BoxFuture<'a, Result<(), HandlerError>>;

    /// The message types the handler sends and publishes, as it declares them
    /// (`#[handler(sends(T, ..), publishes(U, ..))]`): the endpoint checks at `start()`
    /// that each has a route. The default declares nothing (a missing route is then
    /// found at the first send).
    fn declared(&self) -> Declared {
        Declared::default()
    }
}

/// The message types a handler or saga says it sends and publishes. An endpoint whose
/// routes miss one of them refuses to start, with the list of what is missing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    pub(crate) sends: Vec<&'static str>,
    pub(crate) publishes: Vec<&'static str>,
}

impl Declared {
    /// Nothing declared.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares that `M` is sent (a command: it needs `Routes::send::<M>(queue)`).
    #[must_use]
    pub fn send<M: Message>(mut self) -> Self {
        self.sends.push(M::NAME);
        self
    }

    /// Declares that `M` is published (an event: it needs `Routes::event::<M>()`).
    #[must_use]
    pub fn publish<M: Message>(mut self) -> Self {
        self.publishes.push(M::NAME);
        self
    }
}

/// Why a handler failed, and whether retrying can help.
///
/// Any error type converts into it with `?` (it is transient: the message is retried
/// under the endpoint's recoverability policy). Mark an error that no retry can fix as
/// permanent ([`HandlerError::permanent`] or [`ResultExt::permanent`]): the message then
/// goes to the dead-letter queue at once.
pub struct HandlerError {
    permanent: bool,
    source: BoxError,
}

impl HandlerError {
    /// A failure that a later attempt may not see again (the default).
    pub fn transient(source: impl Into<BoxError>) -> Self {
        Self {
            permanent: false,
            source: source.into(),
        }
    }

    /// A failure no retry can fix: the message is dead-lettered at once.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        Self {
            permanent: true,
            source: source.into(),
        }
    }

    /// A transient failure with this text.
    pub fn msg(text: impl fmt::Display) -> Self {
        Self::transient(text.to_string())
    }

    /// Whether the failure was marked permanent.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The error.
    pub fn source(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// The error's text followed by the texts of its causes, outermost first.
    pub fn chain(&self) -> Vec<String> {
        let mut out = vec![self.source.to_string()];
        let mut next = self.source.source();
        while let Some(e) = next {
            out.push(e.to_string());
            next = e.source();
        }
        out
    }

    /// The boxed error.
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("permanent", &self.permanent)
            .field("source", &self.source)
            .finish()
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        Self::transient(e)
    }
}

/// Marks the error of a `Result` as permanent: `repo.load(id).await.permanent()?`.
pub trait ResultExt<T> {
    /// The same result, with its error marked permanent.
    ///
    /// # Errors
    /// The error, as a permanent [`HandlerError`].
    fn permanent(self) -> Result<T, HandlerError>;
}

impl<T, E: Into<HandlerError>> ResultExt<T> for Result<T, E> {
    fn permanent(self) -> Result<T, HandlerError> {
        self.map_err(|e| {
            let mut e = e.into();
            e.permanent = true;
            e
        })
    }
}
