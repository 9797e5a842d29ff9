//! Procedural macros of Courier: `#[derive(Message)]` and `#[handler]`.
//!
//! They only generate trait impls and registration data; the runtime lives in the
//! `courier` crate, which re-exports these macros. Each macro parses its input into a
//! model, checks it (collecting every error with its span), then generates code.

mod handler;
mod message;

use proc_macro::TokenStream;

/// Derives `courier::Message`: a stable wire name and the codec of a serde type.
///
/// Attributes: `#[message(name = "billing.InvoicePaid")]` pins the wire name (default:
/// the Rust path of the type); `aliases = ["old.Name"]` lists earlier names still
/// accepted; `codec = MyCodec` picks another `courier::Codec` (it must implement
/// `Default`).
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
