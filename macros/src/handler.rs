//! `#[handler]`: parse, check, generate.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType, Type};

/// The checked shape of a handler function.
struct Model {
    function: ItemFn,
    message_ty: Type,
    has_context: bool,
    return_ty: Type,
}

fn check(function: ItemFn) -> syn::Result<Model> {
    let mut errors: Vec<syn::Error> = Vec::new();
    let sig = &function.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span(),
            "a handler must be an `async fn`: write `async fn`",
        ));
    }
    if !sig.generics.params.is_empty() {
        errors.push(syn::Error::new(sig.generics.span(), "a handler cannot be generic"));
    }
    if let Some(v) = &sig.variadic {
        errors.push(syn::Error::new(v.span(), "a handler cannot be variadic"));
    }
    let mut inputs = sig.inputs.iter();
    let message_ty = match inputs.next() {
        Some(FnArg::Typed(arg)) => Some((*arg.ty).clone()),
        Some(FnArg::Receiver(r)) => {
            errors.push(syn::Error::new(
                r.span(),
                "a handler is a free function: it cannot take `self`",
            ));
            None
        }
        None => {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                "a handler takes the message as its first argument: `(message: T, ctx: &mut courier::Context)`",
            ));
            None
        }
    };
    let has_context = match inputs.next() {
        None => false,
        Some(FnArg::Typed(arg)) => {
            match &*arg.ty {
                Type::Reference(r) if r.mutability.is_some() => {}
                other => errors.push(syn::Error::new(
                    other.span(),
                    "the second argument of a handler must be `&mut courier::Context`",
                )),
            }
            true
        }
        Some(FnArg::Receiver(r)) => {
            errors.push(syn::Error::new(r.span(), "a handler cannot take `self`"));
            true
        }
    };
    for extra in inputs {
        errors.push(syn::Error::new(
            extra.span(),
            "a handler takes at most two arguments: the message and `&mut courier::Context`",
        ));
    }
    let return_ty = match &sig.output {
        ReturnType::Type(_, ty) => Some((**ty).clone()),
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.span(),
                "a handler must return `Result<(), E>` where `E` converts into `courier::HandlerError`",
            ));
            None
        }
    };
    let mut errors = errors.into_iter();
    if let Some(mut first) = errors.next() {
        for e in errors {
            first.combine(e);
        }
        return Err(first);
    }
    match (message_ty, return_ty) {
        (Some(message_ty), Some(return_ty)) => Ok(Model {
            function,
            message_ty,
            has_context,
            return_ty,
        }),
        _ => Err(syn::Error::new(sig.span(), "not a handler")),
    }
}

pub(crate) fn expand(args: TokenStream, input: TokenStream) -> syn::Result<TokenStream> {
    if !args.is_empty() {
        return Err(syn::Error::new(args.span(), "`#[handler]` takes no arguments"));
    }
    let function: ItemFn = syn::parse2(input)?;
    let model = check(function)?;
    let name = model.function.sig.ident.clone();
    let vis = model.function.vis.clone();
    let docs: Vec<_> = model
        .function
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc") || a.path().is_ident("cfg"))
        .collect();
    let message_ty = &model.message_ty;
    let return_ty = &model.return_ty;
    let inner = format_ident!("__courier_handler_{}", name);
    let mut inner_fn = model.function.clone();
    inner_fn.sig.ident = inner.clone();
    inner_fn.vis = syn::Visibility::Inherited;
    inner_fn.attrs.retain(|a| !a.path().is_ident("doc"));
    let call = if model.has_context {
        quote!(#inner(message, ctx))
    } else {
        quote!({
            let _ = ctx;
            #inner(message)
        })
    };
    let message_check = quote_spanned! {message_ty.span()=>
        const _: () = ::courier::__private::assert_message::<#message_ty>();
    };
    let return_check = quote_spanned! {return_ty.span()=>
        fn __courier_return_check(r: #return_ty) -> ::core::result::Result<(), ::courier::HandlerError> {
            ::courier::__private::into_handler_result(r)
        }
    };
    Ok(quote! {
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #name;

        const _: () = {
            #message_check

            #[automatically_derived]
            impl ::courier::Handler for #name {
                type Message = #message_ty;

                fn name(&self) -> &'static str {
                    ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name))
                }

                fn handle<'a>(
                    &'a self,
                    message: #message_ty,
                    ctx: &'a mut ::courier::Context,
                ) -> ::courier::BoxFuture<'a, ::core::result::Result<(), ::courier::HandlerError>> {
                    #inner_fn
                    #return_check
                    ::std::boxed::Box::pin(async move { __courier_return_check(#call.await) })
                }
            }
        };
    })
}
