//! `#[derive(Message)]`: parse, check, generate.

use proc_macro2::TokenStream;
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::{DeriveInput, Expr, ExprLit, Lit, LitStr, Path};

use crate::version::Versioning;

/// What the attributes say.
struct Model {
    name: Option<LitStr>,
    aliases: Vec<LitStr>,
    codec: Option<Path>,
    /// `version = N` and `upcast = path`.
    versioning: Versioning,
}

/// The attributes `#[message(...)]` takes.
const ATTRIBUTES: [&str; 5] = ["name", "aliases", "codec", "version", "upcast"];

fn check_wire_name(lit: &LitStr, errors: &mut Vec<syn::Error>) -> bool {
    let v = lit.value();
    let problem = if v.is_empty() {
        "a message name cannot be empty"
    } else if v.len() > 200 {
        "a message name is at most 200 characters"
    } else if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "a message name cannot contain whitespace or control characters"
    } else {
        return true;
    };
    errors.push(syn::Error::new(lit.span(), problem));
    false
}

/// The edit distance of two short words (for "did you mean").
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

fn unknown_attribute(meta: &ParseNestedMeta<'_>) -> syn::Error {
    let given = meta.path.get_ident().map(ToString::to_string).unwrap_or_default();
    let close = ATTRIBUTES
        .iter()
        .filter(|known| !given.is_empty() && distance(&given, known) <= 2)
        .min_by_key(|known| distance(&given, known));
    match close {
        Some(known) => meta.error(format!("unknown message attribute `{given}`: did you mean `{known}`?")),
        None => meta.error("unknown message attribute: expected `name`, `aliases`, `codec`, `version` or `upcast`"),
    }
}

pub(crate) fn string_literal(meta: &ParseNestedMeta<'_>, example: &str) -> syn::Result<LitStr> {
    let value = meta.value()?;
    let expr: Expr = value.parse()?;
    match expr {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Ok(s),
        other => Err(syn::Error::new_spanned(
            other,
            format!("expected a string literal: `{example}`"),
        )),
    }
}

/// Reads the `#[message(...)]` attributes; every problem goes to `errors`, in source
/// order, and what could be read goes into the model.
fn parse(input: &DeriveInput, errors: &mut Vec<syn::Error>) -> Model {
    let mut model = Model {
        name: None,
        aliases: Vec::new(),
        codec: None,
        versioning: Versioning::default(),
    };
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("message")) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("name") {
                let lit = string_literal(&meta, "name = \"billing.InvoicePaid\"")?;
                if model.name.is_some() {
                    return Err(syn::Error::new_spanned(&meta.path, "`name` is given twice"));
                }
                if check_wire_name(&lit, errors) {
                    model.name = Some(lit);
                }
                Ok(())
            } else if meta.path.is_ident("aliases") {
                let expr: Expr = meta.value()?.parse()?;
                let Expr::Array(array) = expr else {
                    return Err(syn::Error::new_spanned(
                        expr,
                        "expected a list of names, even of one: `aliases = [\"old.Name\"]`",
                    ));
                };
                for e in array.elems {
                    match e {
                        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => {
                            if model.aliases.iter().any(|a| a.value() == s.value()) {
                                errors.push(syn::Error::new(s.span(), "this alias is given twice"));
                            } else if check_wire_name(&s, errors) {
                                model.aliases.push(s);
                            }
                        }
                        other => errors.push(syn::Error::new_spanned(
                            other,
                            "an alias must be a string literal: `aliases = [\"old.Name\"]`",
                        )),
                    }
                }
                Ok(())
            } else if meta.path.is_ident("codec") {
                let codec: Path = meta.value()?.parse()?;
                if model.codec.is_some() {
                    return Err(syn::Error::new_spanned(&meta.path, "`codec` is given twice"));
                }
                model.codec = Some(codec);
                Ok(())
            } else if meta.path.is_ident("version") {
                model.versioning.parse_version(&meta, "message")
            } else if meta.path.is_ident("upcast") {
                model.versioning.parse_step(&meta, "upcast = Self::upcast")
            } else {
                Err(unknown_attribute(&meta))
            }
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    model.versioning.check("upcast", "message", errors);
    if let Some(name) = &model.name {
        model.aliases.retain(|a| {
            let repeats = a.value() == name.value();
            if repeats {
                errors.push(syn::Error::new(a.span(), "an alias repeats the message name"));
            }
            !repeats
        });
    }
    model
}

pub(crate) fn expand(input: &DeriveInput) -> TokenStream {
    let mut errors = Vec::new();
    let model = parse(input, &mut errors);
    let generic = !input.generics.params.is_empty() || input.generics.where_clause.is_some();
    if generic {
        errors.push(syn::Error::new_spanned(
            &input.generics,
            "a message type cannot be generic: its wire name must be one fixed string",
        ));
    }
    let errors = errors
        .into_iter()
        .reduce(|mut first, e| {
            first.combine(e);
            first
        })
        .map(|e| e.to_compile_error());
    if generic {
        return quote!(#errors);
    }
    // With errors in the attributes, the impl is still generated from what could be read,
    // so that the uses of the type do not add errors of their own.
    let ident = &input.ident;
    let name = match &model.name {
        Some(lit) => quote!(#lit),
        None => quote!(::core::concat!(
            ::core::module_path!(),
            "::",
            ::core::stringify!(#ident)
        )),
    };
    let aliases = &model.aliases;
    // The codec path is passed as written: if it is not a `Codec + Default`, the error is
    // on it, once, with the text of `__private::MessageCodec`.
    let codec_fns = model.codec.as_ref().map(|codec| {
        quote! {
            fn to_envelope(&self) -> ::core::result::Result<::courier::Envelope, ::courier::CodecError> {
                (::courier::__private::codec_fns::<#codec, Self>().encode)(self)
            }
            fn from_envelope(envelope: &::courier::Envelope) -> ::core::result::Result<Self, ::courier::CodecError> {
                (::courier::__private::codec_fns::<#codec, Self>().decode)(envelope)
            }
            fn body_value(
                envelope: &::courier::Envelope,
            ) -> ::core::result::Result<::courier::__private::JsonValue, ::courier::CodecError> {
                (::courier::__private::codec_fns::<#codec, Self>().decode_value)(envelope)
            }
        }
    });
    let versioning = model.versioning.generate("upcast");
    quote! {
        #errors
        const _: () = {
            #[automatically_derived]
            impl ::courier::Message for #ident {
                const NAME: &'static str = #name;
                const ALIASES: &'static [&'static str] = &[#(#aliases),*];
                #versioning
                #codec_fns
            }
        };
    }
}
