//! `version = N` and `upcast = path` / `migrate = path`, as `#[derive(Message)]` and
//! `#[saga]` take them: parsed and checked here, generated as the trait's `VERSION` and
//! the function that calls the user's step.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::meta::ParseNestedMeta;
use syn::{Expr, ExprLit, Lit, Path};

/// A version given in an attribute: its value and where it was written.
#[derive(Clone, Copy)]
pub(crate) struct Version {
    pub(crate) value: u32,
    pub(crate) span: Span,
}

/// A version and its step function, as far as they could be read.
#[derive(Default)]
pub(crate) struct Versioning {
    pub(crate) version: Option<Version>,
    /// The user's step function (`upcast = Self::upcast`).
    pub(crate) step: Option<Path>,
}

impl Versioning {
    /// Reads `version = N`: an integer literal from 1 (unsuffixed, or `u32`). `what` names
    /// what is versioned in the errors ("message", "saga state").
    pub(crate) fn parse_version(&mut self, meta: &ParseNestedMeta<'_>, what: &str) -> syn::Result<()> {
        let expr: Expr = meta.value()?.parse()?;
        let Expr::Lit(ExprLit { lit: Lit::Int(int), .. }) = &expr else {
            return Err(syn::Error::new_spanned(
                expr,
                format!("expected an integer: `version = 2`, the current version of the {what}'s shape"),
            ));
        };
        if self.version.is_some() {
            return Err(syn::Error::new_spanned(&meta.path, "`version` is given twice"));
        }
        let value = match int.suffix() {
            "" | "u32" => int.base10_parse::<u32>().ok(),
            _ => None,
        };
        match value {
            Some(value) if value >= 1 => {
                self.version = Some(Version {
                    value,
                    span: int.span(),
                });
                Ok(())
            }
            _ => Err(syn::Error::new(
                int.span(),
                format!("a {what} version is an integer from 1 (a `u32`): versions start at 1, the default"),
            )),
        }
    }

    /// Reads `upcast = path` (or `migrate = path`): the path of a function.
    pub(crate) fn parse_step(&mut self, meta: &ParseNestedMeta<'_>, example: &str) -> syn::Result<()> {
        let expr: Expr = meta.value()?.parse()?;
        let Expr::Path(path) = expr else {
            return Err(syn::Error::new_spanned(
                expr,
                format!("expected the path of a function: `{example}`"),
            ));
        };
        if self.step.is_some() {
            return Err(syn::Error::new_spanned(&meta.path, "given twice"));
        }
        self.step = Some(path.path);
        Ok(())
    }

    /// A step function needs a version above 1 to have something to step from.
    pub(crate) fn check(&self, keyword: &str, what: &str, errors: &mut Vec<syn::Error>) {
        if let Some(step) = &self.step
            && self.version.is_none_or(|v| v.value < 2)
        {
            errors.push(syn::Error::new_spanned(
                step,
                format!(
                    "`{keyword}` brings an older {what} to the current version, but the current version is 1: \
                     give the new one with `version = 2` (the default, 1, has nothing older)"
                ),
            ));
        }
    }

    /// `const VERSION: u32 = N;` and `fn #name(from, value) { path(from, value) }` for the
    /// trait impl. A step function that is the generated one itself (`Self::upcast` with no
    /// inherent `upcast`) would call itself forever: it is an error, on the path.
    pub(crate) fn generate(&self, name: &str) -> TokenStream {
        let version = self.version.map(|v| {
            let lit = Literal::u32_unsuffixed(v.value);
            quote_spanned!(v.span=> const VERSION: u32 = #lit;)
        });
        let step = self.step.as_ref().map(|path| {
            // Spanned at the user's path, so that the lint below reports there (a lint
            // stays silent on code whose span is the macro's own).
            let span = path.segments.first().map_or_else(Span::call_site, |s| s.ident.span());
            let fn_name = syn::Ident::new(name, span);
            let call = quote!(#path(from, value));
            quote_spanned! {span=>
                #[deny(unconditional_recursion)]
                fn #fn_name(
                    from: u32,
                    value: ::courier::__private::JsonValue,
                ) -> ::core::result::Result<::courier::__private::JsonValue, ::courier::__private::UpcastError> {
                    #call
                }
            }
        });
        quote!(#version #step)
    }
}
