//! `sends(A, B)` and `publishes(C)` in `#[handler(...)]` and `#[saga(...)]`: the message
//! types a handler or saga says it sends, which the endpoint checks against its routes
//! when it starts (a missing route is an error at `start()`, not at the first send).

use proc_macro2::TokenStream;
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::parse::Parse;
use syn::punctuated::Punctuated;
use syn::{Token, Type};

/// The declared types, as written.
#[derive(Default)]
pub(crate) struct Declared {
    sends: Vec<Type>,
    publishes: Vec<Type>,
}

impl Declared {
    /// Reads `sends(..)` or `publishes(..)`; `Ok(false)` if `meta` is neither.
    pub(crate) fn parse(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<bool> {
        let out = if meta.path.is_ident("sends") {
            &mut self.sends
        } else if meta.path.is_ident("publishes") {
            &mut self.publishes
        } else {
            return Ok(false);
        };
        if meta.input.peek(Token![=]) {
            return Err(meta.error("write the types in parentheses: `sends(ChargeCard, RefundPayment)`"));
        }
        let content;
        syn::parenthesized!(content in meta.input);
        let types: Punctuated<Type, Token![,]> = content.parse_terminated(Type::parse, Token![,])?;
        if types.is_empty() {
            return Err(meta.error("name at least one message type, or leave it out"));
        }
        out.extend(types);
        Ok(true)
    }

    /// `::courier::Declared::new().send::<A>()...`, or nothing when nothing is declared.
    pub(crate) fn tokens(&self) -> Option<TokenStream> {
        if self.sends.is_empty() && self.publishes.is_empty() {
            return None;
        }
        let sends = &self.sends;
        let publishes = &self.publishes;
        Some(quote! {
            ::courier::Declared::new() #(.send::<#sends>())* #(.publish::<#publishes>())*
        })
    }
}
