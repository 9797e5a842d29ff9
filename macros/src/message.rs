//! `#[derive(Message)]`: parse, check, generate.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;
use syn::{DeriveInput, Expr, ExprLit, Lit, LitStr, Path};

/// What the attributes say.
struct Model {
    name: Option<LitStr>,
    aliases: Vec<LitStr>,
    codec: Option<Path>,
}

fn check_wire_name(lit: &LitStr, errors: &mut Vec<syn::Error>) {
    let v = lit.value();
    if v.is_empty() {
        errors.push(syn::Error::new(lit.span(), "a message name cannot be empty"));
    } else if v.len() > 200 {
        errors.push(syn::Error::new(lit.span(), "a message name is at most 200 characters"));
    } else if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        errors.push(syn::Error::new(
            lit.span(),
            "a message name cannot contain whitespace or control characters",
        ));
    }
}

fn parse(input: &DeriveInput, errors: &mut Vec<syn::Error>) -> Model {
    let mut model = Model {
        name: None,
        aliases: Vec::new(),
        codec: None,
    };
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("message")) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("name") {
                let lit: LitStr = meta.value()?.parse()?;
                check_wire_name(&lit, errors);
                if model.name.replace(lit).is_some() {
                    return Err(meta.error("`name` is given twice"));
                }
                Ok(())
            } else if meta.path.is_ident("aliases") {
                let expr: Expr = meta.value()?.parse()?;
                let Expr::Array(array) = expr else {
                    return Err(syn::Error::new(expr.span(), "expected a list: `aliases = [\"old.Name\"]`"));
                };
                for e in array.elems {
                    match e {
                        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => {
                            check_wire_name(&s, errors);
                            model.aliases.push(s);
                        }
                        other => errors.push(syn::Error::new(other.span(), "an alias must be a string literal")),
                    }
                }
                Ok(())
            } else if meta.path.is_ident("codec") {
                model.codec = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error("unknown message attribute: expected `name`, `aliases` or `codec`"))
            }
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    if !input.generics.params.is_empty() {
        errors.push(syn::Error::new(
            input.generics.span(),
            "a message type cannot be generic: its wire name must be one fixed string",
        ));
    }
    if let (Some(name), true) = (&model.name, !model.aliases.is_empty()) {
        for a in &model.aliases {
            if a.value() == name.value() {
                errors.push(syn::Error::new(a.span(), "an alias repeats the message name"));
            }
        }
    }
    model
}

pub(crate) fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let mut errors = Vec::new();
    let model = parse(input, &mut errors);
    if let Some(mut first) = errors.pop() {
        for e in errors {
            first.combine(e);
        }
        return Err(first);
    }
    let ident = &input.ident;
    let name = match &model.name {
        Some(lit) => quote!(#lit),
        None => quote!(::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident))),
    };
    let aliases = &model.aliases;
    let codec_fns = model.codec.as_ref().map(|codec| {
        quote! {
            fn to_envelope(&self) -> ::core::result::Result<::courier::Envelope, ::courier::CodecError> {
                let codec = <#codec as ::core::default::Default>::default();
                ::core::result::Result::Ok(
                    ::courier::Envelope::encode(&codec, self)?
                        .with_message_type(<Self as ::courier::Message>::NAME),
                )
            }
            fn from_envelope(envelope: &::courier::Envelope) -> ::core::result::Result<Self, ::courier::CodecError> {
                let codec = <#codec as ::core::default::Default>::default();
                envelope.decode(&codec)
            }
        }
    });
    let _ = Span::call_site();
    Ok(quote! {
        const _: () = {
            #[automatically_derived]
            impl ::courier::Message for #ident {
                const NAME: &'static str = #name;
                const ALIASES: &'static [&'static str] = &[#(#aliases),*];
                #codec_fns
            }
        };
    })
}
