//! What `#[derive(Message)]` and `#[handler]` implement: the [`Message`] and [`Handler`]
//! traits, and the [`HandlerError`] a handler returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{CodecError, JsonCodec};
use crate::endpoint::context::Context;
use crate::error::BoxError;
use crate::message::Envelope;
use crate::version::UpcastError;

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
        crate::version::stamp::<Self>(&mut envelope);
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

/// What the macros call. Not a public API: it changes without notice.
///
/// Each check is a generic function the macros call with the user's own type tokens as
/// explicit type arguments, so that a failed bound is reported on those tokens, once, with
/// the text of the trait's `#[diagnostic::on_unimplemented]`.
#[doc(hidden)]
pub mod __private {
    pub use super::BoxFuture;
    pub use crate::codec::{Codec, CodecError};
    pub use crate::endpoint::context::Context;
    pub use crate::endpoint::handler::{Handler, HandlerError, Message};
    pub use crate::message::Envelope;
    pub use crate::version::UpcastError;
    pub use serde_json::Value as JsonValue;

    /// The return types a `#[handler]` function may have: a `Result`, whose success type
    /// is `()` ([`HandlerOk`]) and whose error converts into [`HandlerError`]
    /// ([`HandlerErrorType`]).
    #[diagnostic::on_unimplemented(
        message = "a Courier handler must return `Result<(), E>` where `E` converts into `courier::HandlerError`, not `{Self}`",
        label = "wrong return type for a handler",
        note = "any `std::error::Error + Send + Sync + 'static` converts; so does `courier::HandlerError`"
    )]
    pub trait HandlerReturn {
        /// The success type.
        type Ok;
        /// The error type.
        type Error;
        /// The value as a `Result`.
        ///
        /// # Errors
        /// The handler's error.
        fn into_result(self) -> Result<Self::Ok, Self::Error>;
    }

    impl<T, E> HandlerReturn for Result<T, E> {
        type Ok = T;
        type Error = E;
        fn into_result(self) -> Self {
            self
        }
    }

    /// The success type of a handler's `Result`: only `()`.
    #[diagnostic::on_unimplemented(
        message = "a Courier handler must return `Result<(), E>`: its success type must be `()`, not `{Self}`",
        label = "must be `()`",
        note = "a handler only succeeds or fails; to pass a value on, send or publish a message with the `Context`"
    )]
    pub trait HandlerOk {}

    impl HandlerOk for () {}

    /// The error type of a handler's `Result`: anything that converts into [`HandlerError`].
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be the error type of a Courier handler: it does not convert into `courier::HandlerError`",
        label = "not an error type",
        note = "any `std::error::Error + Send + Sync + 'static` converts; so does `courier::HandlerError`"
    )]
    pub trait HandlerErrorType {
        /// The error as the framework sees it.
        fn into_handler_error(self) -> HandlerError;
    }

    impl<E: Into<HandlerError>> HandlerErrorType for E {
        fn into_handler_error(self) -> HandlerError {
            self.into()
        }
    }

    /// The type behind the `&mut` of a handler's second argument: only [`Context`].
    #[diagnostic::on_unimplemented(
        message = "the second argument of a Courier handler must be `&mut courier::Context`, not `&mut {Self}`",
        label = "not `courier::Context`"
    )]
    pub trait ContextArg {
        /// The context, as the handler function takes it.
        fn from_context(ctx: &mut Context) -> &mut Self;
    }

    impl ContextArg for Context {
        fn from_context(ctx: &mut Context) -> &mut Self {
            ctx
        }
    }

    /// What the codec of `#[message(codec = C)]` must be: a [`Codec`] with a [`Default`].
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be the codec of a Courier message",
        label = "not a codec",
        note = "a message codec implements `courier::Codec` and `Default`"
    )]
    pub trait MessageCodec: Codec + Default {}

    impl<C: Codec + Default> MessageCodec for C {}

    /// How a message with `#[message(codec = C)]` is encoded and decoded.
    #[derive(Debug)]
    pub struct CodecFns<M> {
        /// [`Message::to_envelope`].
        pub encode: fn(&M) -> Result<Envelope, CodecError>,
        /// [`Message::from_envelope`].
        pub decode: fn(&Envelope) -> Result<M, CodecError>,
        /// [`Message::body_value`].
        pub decode_value: fn(&Envelope) -> Result<serde_json::Value, CodecError>,
    }

    /// The encoding of `M` with the codec `C`. The methods of the generated impl call
    /// this one function, so that a codec that is not one is reported once.
    pub fn codec_fns<C: MessageCodec, M: Message>() -> CodecFns<M> {
        CodecFns {
            encode: |m| {
                let mut envelope = Envelope::encode(&C::default(), m)?.with_message_type(M::NAME);
                crate::version::stamp::<M>(&mut envelope);
                Ok(envelope)
            },
            decode: |e| e.decode(&C::default()),
            decode_value: |e| e.decode(&C::default()),
        }
    }

    /// The result of a handler declared `-> Result<T, E>`, checked part by part.
    ///
    /// # Errors
    /// The handler's error, converted.
    pub fn into_handler_result<T: HandlerOk, E: HandlerErrorType>(r: Result<T, E>) -> Result<(), HandlerError> {
        match r {
            Ok(_) => Ok(()),
            Err(e) => Err(e.into_handler_error()),
        }
    }

    /// The conversion of the result of a handler declared with any other return type (an
    /// alias of a `Result`, say). It takes no value, so that a failed bound is reported on
    /// the explicit type argument.
    pub fn handler_return<R>() -> fn(R) -> Result<(), HandlerError>
    where
        R: HandlerReturn,
        R::Ok: HandlerOk,
        R::Error: HandlerErrorType,
    {
        |r| into_handler_result(r.into_result())
    }

    /// The context as a handler's second argument takes it.
    pub fn context_arg<T: ContextArg + ?Sized>(ctx: &mut Context) -> &mut T {
        T::from_context(ctx)
    }

    /// The message type of what `#[handler]` leaves in place of a function it rejected (with
    /// a compile error), so that the uses of its name add no errors of their own. It has no
    /// value: such a handler never runs, and never compiles into a program.
    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    pub enum Rejected {}

    impl Message for Rejected {
        const NAME: &'static str = "courier.__private.Rejected";
    }

    // `#[saga]`: the saga API the generated `Saga` impls use, and the checks of their
    // handlers' signatures and correlations.

    pub use crate::saga::{Correlate, Saga, SagaContext, SagaFn, SagaHandlers};

    /// The message type of a saga handler: a [`Message`].
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is not a Courier message: a saga handler takes a message",
        label = "not a message type",
        note = "add `#[derive(serde::Serialize, serde::Deserialize, courier::Message)]` to the type"
    )]
    pub trait SagaMessage: Message {}

    impl<M: Message> SagaMessage for M {}

    /// [`SagaHandlers::start`], with the message type checked by [`SagaMessage`].
    pub fn saga_start<S: Saga, M: SagaMessage>(
        handlers: &mut SagaHandlers<S>,
        name: &'static str,
        correlate: Correlate<M>,
        f: SagaFn<S, M>,
    ) {
        handlers.start(name, correlate, f);
    }

    /// [`SagaHandlers::handle`], with the message type checked by [`SagaMessage`].
    pub fn saga_handle<S: Saga, M: SagaMessage>(
        handlers: &mut SagaHandlers<S>,
        name: &'static str,
        correlate: Correlate<M>,
        f: SagaFn<S, M>,
    ) {
        handlers.handle(name, correlate, f);
    }

    /// [`SagaHandlers::handle_by_property`], with the message type checked by
    /// [`SagaMessage`].
    pub fn saga_handle_by_property<S: Saga, M: SagaMessage>(
        handlers: &mut SagaHandlers<S>,
        name: &'static str,
        property: &'static str,
        correlate: Correlate<M>,
        f: SagaFn<S, M>,
    ) {
        handlers.handle_by_property(name, property, correlate, f);
    }

    /// [`SagaHandlers::not_found`], with the message type checked by [`SagaMessage`].
    pub fn saga_not_found<S: Saga, M: SagaMessage>(
        handlers: &mut SagaHandlers<S>,
        name: &'static str,
        f: crate::saga::NotFoundFn<M>,
    ) {
        handlers.not_found(name, f);
    }

    /// [`SagaHandlers::timeout`], with the message type checked by [`SagaMessage`].
    pub fn saga_timeout<S: Saga, M: SagaMessage>(handlers: &mut SagaHandlers<S>, name: &'static str, f: SagaFn<S, M>) {
        handlers.timeout(name, f);
    }

    /// The type behind the `&mut` of a saga handler's context argument: only
    /// [`SagaContext`].
    #[diagnostic::on_unimplemented(
        message = "the context of a Courier saga handler must be `&mut courier::saga::SagaContext<'_>`, not `&mut {Self}`",
        label = "not `SagaContext`",
        note = "`SagaContext` derefs to `courier::Context`: `send`, `publish` and the rest are there too"
    )]
    pub trait SagaContextArg<'b> {
        /// The context, as the handler method takes it.
        fn from_saga_context<'a>(ctx: &'a mut SagaContext<'b>) -> &'a mut Self;
    }

    impl<'b> SagaContextArg<'b> for SagaContext<'b> {
        fn from_saga_context<'a>(ctx: &'a mut SagaContext<'b>) -> &'a mut Self {
            ctx
        }
    }

    /// The context as a saga handler's context argument takes it.
    pub fn saga_context_arg<'a, 'b, T: SagaContextArg<'b> + ?Sized>(ctx: &'a mut SagaContext<'b>) -> &'a mut T {
        T::from_saga_context(ctx)
    }

    /// The type of a field a saga correlates by (`#[start(by = field)]`): its text is the
    /// instance's correlation value.
    #[diagnostic::on_unimplemented(
        message = "a saga cannot correlate by a `{Self}`: the correlation value is written as text, with `std::fmt::Display`",
        label = "not a correlation value",
        note = "correlate by a field that is a string, a number or an id implementing `Display`, or by a header"
    )]
    pub trait CorrelationValue {
        /// The correlation value.
        fn correlation_value(&self) -> String;
    }

    impl<T: std::fmt::Display + ?Sized> CorrelationValue for T {
        fn correlation_value(&self) -> String {
            self.to_string()
        }
    }

    /// The correlation value of a field.
    pub fn correlation_value<T: CorrelationValue + ?Sized>(field: &T) -> String {
        field.correlation_value()
    }

    /// The fields a saga correlates by all have one type: the type of the first.
    #[diagnostic::on_unimplemented(
        message = "a saga correlates all its messages by values of one type: this field is a `{Self}`, the first `by` field of the saga a `{First}`",
        label = "expected a `{First}`, as the first `by` field",
        note = "an instance is found by its correlation value as text: fields of different types that read alike would find the same instance by accident; correlate by fields of one type, or by a header"
    )]
    pub trait SameCorrelation<First: ?Sized> {}

    impl<T: ?Sized> SameCorrelation<T> for T {}

    /// Checks that a later `by` field of a saga has the type of its first.
    pub fn same_correlation<First: ?Sized, Later: SameCorrelation<First> + ?Sized>(_first: &First, _later: &Later) {}
}
