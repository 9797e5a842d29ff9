//! Procedural macros of Courier: `#[derive(Message)]`, `#[handler]` and `#[saga]`.
//!
//! They only generate trait impls and registration data; the runtime lives in the
//! `courier` crate, which re-exports these macros. Each macro parses its input into a
//! model, checks it (collecting every error with its span), then generates code.

mod declared;
mod handler;
mod message;
mod saga;
mod version;

use proc_macro::TokenStream;

/// Derives `courier::Message`: a stable wire name and the codec of a serde type.
///
/// Attributes: `#[message(name = "billing.InvoicePaid")]` pins the wire name (default:
/// the Rust path of the type); `aliases = ["old.Name"]` lists earlier names still
/// accepted; `codec = MyCodec` picks another `courier::Codec` (it must implement
/// `Default`); `version = 3` is the current version of the type's wire shape (default 1)
/// and `upcast = Self::upcast` the function (`fn(u32, serde_json::Value) ->
/// Result<serde_json::Value, courier::UpcastError>`) that brings a body of an older
/// version to the next one.
#[proc_macro_derive(Message, attributes(message))]
pub fn derive_message(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    message::expand(&input).into()
}

/// Turns `async fn name(message: T, ctx: &mut courier::Context) -> Result<(), E>` into a
/// handler: a unit struct `name` implementing `courier::Handler`, registered with
/// `EndpointBuilder::handler(name)`.
///
/// `T` is a `courier::Message`, taken by value; `ctx` may be left out; `E` is any
/// `std::error::Error + Send + Sync + 'static`, or `courier::HandlerError`. Every mistake
/// in the signature is a compile error on the tokens at fault (see the UI tests in
/// `tests/macros/ui`).
#[proc_macro_attribute]
pub fn handler(args: TokenStream, input: TokenStream) -> TokenStream {
    handler::expand(&args.into(), &input.into()).into()
}

/// Implements `courier::saga::Saga` for the state type of an inherent impl block, whose
/// methods marked `#[start]`, `#[handle]` or `#[timeout]` are the saga's handlers:
///
/// ```text
/// #[courier::saga] // or #[courier::saga(name = "accounts.SignUp")]
/// impl SignUp {
///     #[start(by = user_id)] // correlated by a field of the message (`by = order.id` too)
///     async fn registered(&mut self, msg: UserRegistered, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> { .. }
///
///     #[handle(header = "x-user-id")] // correlated by a header of the message
///     async fn confirmed(&mut self, msg: EmailConfirmed) -> Result<(), MyError> { .. }
///
///     #[timeout] // requested with `SagaContext::request_timeout`: it finds its instance by itself
///     async fn expired(&mut self, msg: Expired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> { .. }
/// }
/// ```
///
/// The state type is `Default + Serialize + DeserializeOwned + Send + Sync + 'static`. The
/// saga's name is pinned with `name` (default: the module path of the impl block and the
/// type's name); `version = 2` is the current version of the state's shape (default 1,
/// stored with each instance) and `migrate = Self::migrate` the function
/// (`fn(u32, serde_json::Value) -> Result<serde_json::Value, courier::UpcastError>`)
/// that brings a state stored at an older version to the next one. Each handler is
/// registered under its method's name. A handler takes
/// `&mut self`, a `courier::Message` by value and, optionally, `&mut SagaContext<'_>`, and
/// returns `Result<(), E>` where `E` converts into `courier::HandlerError`. Every `by`
/// field of a saga has one type (its `Display` text is the instance's correlation value);
/// each message type has one handler; one handler is a `#[start]`. Every mistake is a
/// compile error on the tokens at fault (see the UI tests in `tests/macros/ui`). Other
/// items of the impl block are left as they are.
#[proc_macro_attribute]
pub fn saga(args: TokenStream, input: TokenStream) -> TokenStream {
    saga::expand(&args.into(), &input.into()).into()
}
