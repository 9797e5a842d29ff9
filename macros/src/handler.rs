//! `#[handler]`: parse, check, generate. A first argument `Batch<T>` makes a batch
//! handler of `T` (`courier::BatchHandler`, with a `&mut courier::BatchContext`).
//!
//! The syntactic checks (shape of the signature) are made here, each error on the tokens
//! at fault, all reported together. The type checks (the message is a `Message`, the
//! return type is a `Result<(), E>` with a convertible `E`, the context is a `Context`) are
//! left to the compiler: the generated code passes the user's own type tokens as explicit
//! type arguments to `::courier::__private` functions, so that a failed bound is reported
//! once, on those tokens, with the text of the trait's `#[diagnostic::on_unimplemented]`.

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, ItemFn, PathArguments, ReturnType, Signature, Type};

use crate::declared::Declared;

/// The checked shape of a handler function.
struct Model<'f> {
    function: &'f ItemFn,
    message_ty: Type,
    /// `T` of a second argument `&mut T` (the compiler checks that it is `Context`).
    context_ty: Option<Type>,
    return_ty: Type,
}

/// `name(args)`: where a missing return type belongs.
pub(crate) fn name_and_arguments(sig: &Signature) -> TokenStream {
    // Only the spans of the first and the last token count.
    let close = Ident::new("close", sig.paren_token.span.close());
    let name = &sig.ident;
    quote!(#name #close)
}

pub(crate) fn combine(errors: Vec<syn::Error>) -> Option<syn::Error> {
    errors.into_iter().reduce(|mut first, e| {
        first.combine(e);
        first
    })
}

fn check(function: &ItemFn) -> syn::Result<Model<'_>> {
    let mut errors: Vec<syn::Error> = Vec::new();
    let sig = &function.sig;
    if let Some(c) = &sig.constness {
        errors.push(syn::Error::new_spanned(c, "a handler cannot be a `const fn`"));
    }
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            "a handler must be an `async fn`: write `async fn`",
        ));
    }
    if let Some(u) = &sig.unsafety {
        errors.push(syn::Error::new_spanned(u, "a handler cannot be `unsafe`"));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(abi, "a handler cannot have an ABI"));
    }
    if !sig.generics.params.is_empty() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "a handler cannot be generic: it handles one message type, with no lifetime of its own",
        ));
    }
    if let Some(w) = &sig.generics.where_clause {
        errors.push(syn::Error::new_spanned(w, "a handler cannot have a `where` clause"));
    }
    if let Some(v) = &sig.variadic {
        errors.push(syn::Error::new_spanned(v, "a handler cannot be variadic"));
    }
    // A `self` is reported on its own; the other arguments are checked as if it were not
    // there, so that it does not shift them into the wrong roles.
    let mut typed = Vec::new();
    for arg in &sig.inputs {
        match arg {
            FnArg::Receiver(r) => errors.push(syn::Error::new_spanned(
                r,
                "a handler is a free function: it cannot take `self`",
            )),
            FnArg::Typed(t) => typed.push(t),
        }
    }
    if let Some(error) = swapped_arguments(&typed, "(message: T, ctx: &mut courier::Context)") {
        return Err(error);
    }
    let message_ty = match typed.first().map(|arg| &*arg.ty) {
        Some(Type::Reference(r)) => {
            errors.push(syn::Error::new_spanned(
                r,
                "a handler takes the message by value, as its owner: drop the `&`",
            ));
            None
        }
        Some(ty @ Type::ImplTrait(_)) => {
            errors.push(syn::Error::new_spanned(
                ty,
                "a handler handles one message type: name it, with no `impl`",
            ));
            None
        }
        Some(ty) => Some(ty.clone()),
        None => {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                "a handler takes the message as its first argument: `(message: T, ctx: &mut courier::Context)`",
            ));
            None
        }
    };
    let context_ty = match typed.get(1) {
        None => None,
        Some(arg) => match &*arg.ty {
            Type::Reference(r) if r.mutability.is_some() => match &r.lifetime {
                // The context is borrowed for the call only: `&'a mut` outlives it.
                Some(l) if l.ident != "_" => {
                    errors.push(syn::Error::new_spanned(
                        l,
                        "the context is lent to the handler for one call: write `&mut courier::Context`, with no lifetime",
                    ));
                    None
                }
                _ => Some((*r.elem).clone()),
            },
            other => {
                errors.push(syn::Error::new_spanned(
                    other,
                    "the second argument of a handler must be `&mut courier::Context`",
                ));
                None
            }
        },
    };
    for extra in typed.iter().skip(2) {
        errors.push(syn::Error::new_spanned(
            extra,
            "a handler takes at most two arguments: the message and `ctx: &mut courier::Context`",
        ));
    }
    let return_ty = match &sig.output {
        ReturnType::Type(_, ty) => match &**ty {
            Type::ImplTrait(_) | Type::Infer(_) | Type::Never(_) => {
                errors.push(syn::Error::new_spanned(
                    ty,
                    "a handler must return `Result<(), E>` where `E` converts into `courier::HandlerError`",
                ));
                None
            }
            ty => Some(ty.clone()),
        },
        ReturnType::Default => {
            errors.push(syn::Error::new_spanned(
                name_and_arguments(sig),
                "a handler must return `Result<(), E>` where `E` converts into `courier::HandlerError`: \
                 add `-> Result<(), courier::HandlerError>`",
            ));
            None
        }
    };
    if let Some(error) = combine(errors) {
        return Err(error);
    }
    match (message_ty, return_ty) {
        (Some(message_ty), Some(return_ty)) => Ok(Model {
            function,
            message_ty,
            context_ty,
            return_ty,
        }),
        // Unreachable: a missing part always comes with an error above.
        _ => Err(syn::Error::new_spanned(&function.sig, "not a handler")),
    }
}

/// One error for a context written before the message (`(ctx: &mut Context, msg: T)`),
/// rather than one for each argument in the wrong place. `shape` is the right order.
pub(crate) fn swapped_arguments(typed: &[&syn::PatType], shape: &str) -> Option<syn::Error> {
    let (first, second) = (typed.first()?, typed.get(1)?);
    let first_is_context = matches!(&*first.ty, Type::Reference(r) if r.mutability.is_some());
    let second_is_message = !matches!(&*second.ty, Type::Reference(_) | Type::ImplTrait(_));
    (first_is_context && second_is_message).then(|| {
        syn::Error::new_spanned(
            quote!(#first, #second),
            format!("the message and the context are swapped: the message comes first, `{shape}`"),
        )
    })
}

/// The spans of the first and the last token of `tokens`.
pub(crate) fn first_and_last_spans(tokens: &impl ToTokens) -> (Span, Span) {
    let mut iter = tokens.to_token_stream().into_iter();
    let first = iter.next().map_or_else(Span::call_site, |t| t.span());
    let last = iter.last().map_or(first, |t| t.span());
    (first, last)
}

/// `T` and `E` of a return type written `Result<T, E>`, to check each on its own tokens.
pub(crate) fn result_parts(ty: &Type) -> Option<(&Type, &Type)> {
    let Type::Path(path) = ty else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(Some(ok)), Some(Some(err)), None) => Some((ok, err)),
        _ => None,
    }
}

/// `T` of a first argument written `Batch<T>` (or `courier::Batch<T>`): the handler is
/// then a batch handler of `T`.
fn batch_item(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != "Batch" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter();
    match (types.next(), types.next()) {
        (Some(GenericArgument::Type(item)), None) => Some(item),
        _ => None,
    }
}

/// What a handler that did not pass the checks leaves behind: the errors, and a unit
/// struct of the function's name implementing `Handler` for a message type that has no
/// value, so that the uses of the name (`.handler(name)`) add no errors of their own. A
/// method (with `self`, so in an `impl` or a trait) is left as it is instead.
fn recovery(errors: Option<syn::Error>, function: &ItemFn) -> TokenStream {
    let errors = errors.map(|e| e.to_compile_error());
    if function.sig.receiver().is_some() {
        // A method: no struct can go where it is. It stays as it was.
        return quote!(#errors #function);
    }
    let name = &function.sig.ident;
    let vis = &function.vis;
    let cfgs: Vec<_> = function.attrs.iter().filter(|a| a.path().is_ident("cfg")).collect();
    quote! {
        #errors
        #(#cfgs)*
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #name;

        #(#cfgs)*
        const _: () = {
            impl ::courier::Handler for #name {
                type Message = ::courier::__private::Rejected;

                fn name(&self) -> &'static str {
                    ::core::stringify!(#name)
                }

                fn handle<'a>(
                    &'a self,
                    message: ::courier::__private::Rejected,
                    _: &'a mut ::courier::Context,
                ) -> ::courier::BoxFuture<'a, ::core::result::Result<(), ::courier::HandlerError>> {
                    match message {}
                }
            }
        };
    }
}

pub(crate) fn expand(args: &TokenStream, input: &TokenStream) -> TokenStream {
    let mut declared = Declared::default();
    let parser = syn::meta::parser(|meta| {
        if declared.parse(&meta)? {
            Ok(())
        } else {
            Err(meta.error(
                "unknown argument of `#[handler]`: it takes `sends(T, ..)` and `publishes(T, ..)`, the message \
                 types it sends (checked against the endpoint's routes at start); the message type it handles is \
                 the type of its first argument",
            ))
        }
    });
    let args_error = syn::parse::Parser::parse2(parser, args.clone()).err();
    let function: ItemFn = match syn::parse2(input.clone()) {
        Ok(f) => f,
        Err(e) => {
            // Not a function: the item is left as it is, with the error on its first token.
            let not_fn = syn::Error::new(e.span(), "`#[handler]` goes on an `async fn`");
            let errors = combine(args_error.into_iter().chain([not_fn]).collect()).map(|e| e.to_compile_error());
            return quote!(#errors #input);
        }
    };
    let model = match check(&function) {
        Ok(model) => model,
        Err(error) => {
            let errors = combine(args_error.into_iter().chain([error]).collect());
            return recovery(errors, &function);
        }
    };
    // Arguments are an error of their own: the handler is still generated and checked.
    let args_error = args_error.map(|e| e.to_compile_error());
    let generated = generate(&model, &declared);
    quote!(#args_error #generated)
}

fn generate(model: &Model<'_>, declared: &Declared) -> TokenStream {
    let name = &model.function.sig.ident;
    let vis = &model.function.vis;
    let docs: Vec<_> = model
        .function
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc") || a.path().is_ident("cfg"))
        .collect();
    let cfgs: Vec<_> = model
        .function
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .collect();
    // `Batch<T>` as the first argument: a batch handler of `T`.
    let batch_of = batch_item(&model.message_ty);
    let message_ty = batch_of.unwrap_or(&model.message_ty);
    let return_ty = &model.return_ty;
    let inner = format_ident!("__courier_handler_{}", name);
    let mut inner_fn = model.function.clone();
    inner_fn.sig.ident = inner.clone();
    inner_fn.vis = syn::Visibility::Inherited;
    inner_fn.attrs.retain(|a| !a.path().is_ident("doc"));
    // The explicit type arguments below are the user's tokens: a failed bound is reported
    // on them (the second argument's type, the return type or its parts).
    let call = match &model.context_ty {
        Some(ty) if batch_of.is_some() => quote!(#inner(message, ::courier::__private::batch_context_arg::<#ty>(ctx))),
        Some(ty) => quote!(#inner(message, ::courier::__private::context_arg::<#ty>(ctx))),
        None => quote!({
            let _ = ctx;
            #inner(message)
        }),
    };
    let result = match result_parts(return_ty) {
        Some((ok, err)) => quote!(::courier::__private::into_handler_result::<#ok, #err>(#call.await)),
        None => {
            // A return type that is not a `Result` at all is reported on the call's span:
            // from its path to its parentheses, which here are those of the return type.
            let (first, last) = first_and_last_spans(return_ty);
            let path = quote_spanned!(first=> ::courier::__private::handler_return::<#return_ty>);
            let mut parens = Group::new(Delimiter::Parenthesis, TokenStream::new());
            parens.set_span(last);
            quote!((#path #parens)(#call.await))
        }
    };
    // On the message type's tokens: a private message type behind a public handler is
    // reported there, not on the attribute.
    let message_assoc = quote_spanned! {message_ty.span()=>
        type Message = #message_ty;
    };
    // On the function's name: a future that is not `Send` is reported there.
    let boxed = quote_spanned! {name.span()=>
        ::std::boxed::Box::pin(async move { #result })
    };
    let declared_fn = declared.tokens().map(|d| {
        quote! {
            fn declared(&self) -> ::courier::Declared {
                #d
            }
        }
    });
    let (trait_path, argument_ty, context_ty) = match batch_of {
        Some(item) => (
            quote!(::courier::BatchHandler),
            quote!(::courier::Batch<#item>),
            quote!(::courier::BatchContext),
        ),
        None => (
            quote!(::courier::Handler),
            quote!(#message_ty),
            quote!(::courier::Context),
        ),
    };
    quote! {
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #name;

        #(#cfgs)*
        const _: () = {
            #[automatically_derived]
            impl #trait_path for #name {
                #message_assoc

                fn name(&self) -> &'static str {
                    ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name))
                }

                #declared_fn

                fn handle<'a>(
                    &'a self,
                    message: #argument_ty,
                    ctx: &'a mut #context_ty,
                ) -> ::courier::BoxFuture<'a, ::core::result::Result<(), ::courier::HandlerError>> {
                    #inner_fn
                    #boxed
                }
            }
        };
    }
}
