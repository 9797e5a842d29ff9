//! What the macros call. Not a public API: it changes without notice.
//!
//! Each check is a generic function the macros call with the user's own type tokens as
//! explicit type arguments, so that a failed bound is reported on those tokens, once, with
//! the text of the trait's `#[diagnostic::on_unimplemented]`.
//!
//! This room sits at the crate root because it names both the endpoint (handlers, the
//! context) and the sagas: the endpoint itself never imports the saga module.

pub use crate::codec::{Codec, CodecError};
pub use crate::endpoint::context::Context;
pub use crate::endpoint::handler::BoxFuture;
pub use crate::endpoint::handler::{Handler, HandlerError, Message};
pub use crate::endpoint::version::UpcastError;
pub use crate::message::Envelope;
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

/// The type behind the `&mut` of a batch handler's second argument: only
/// [`BatchContext`](crate::BatchContext).
#[diagnostic::on_unimplemented(
    message = "the second argument of a Courier batch handler must be `&mut courier::BatchContext`, not `&mut {Self}`",
    label = "not `courier::BatchContext`"
)]
pub trait BatchContextArg {
    /// The context, as the batch handler function takes it.
    fn from_batch_context(ctx: &mut crate::BatchContext) -> &mut Self;
}

impl BatchContextArg for crate::BatchContext {
    fn from_batch_context(ctx: &mut crate::BatchContext) -> &mut Self {
        ctx
    }
}

/// The context as a batch handler's second argument takes it.
pub fn batch_context_arg<T: BatchContextArg + ?Sized>(ctx: &mut crate::BatchContext) -> &mut T {
    T::from_batch_context(ctx)
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
            crate::endpoint::version::stamp::<M>(&mut envelope);
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
