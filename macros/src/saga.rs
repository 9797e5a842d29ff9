//! `#[saga]`: parse, check, generate.
//!
//! The attribute goes on the inherent impl block of a saga's state type; the methods
//! marked `#[start]`, `#[handle]` or `#[timeout]` are the saga's handlers. The syntactic
//! checks (the shape of the impl and of each handler's signature, the correlations, one
//! role per handler, one handler per message type, a start handler) are made here, each
//! error on the tokens at fault, all reported together. The type checks (the message is
//! a `Message`, the context a `SagaContext`, the return type a `Result<(), E>` with a
//! convertible `E`, the correlation fields `Display` and of one type) are left to the
//! compiler, as `#[handler]` leaves them: the generated code passes the user's own tokens
//! to `::courier::__private` functions, so that a failed bound is reported on them.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::{Attribute, FnArg, ImplItem, ImplItemFn, Item, ItemImpl, LitStr, Type};

use crate::declared::Declared;
use crate::handler::{combine, first_and_last_spans, name_and_arguments, result_parts, swapped_arguments};
use crate::message::{distance, string_literal};
use crate::version::Versioning;

mod roles;

use roles::{Correlation, Role, misspelt_role, parse_role, unknown_argument};

/// A checked handler method.
struct HandlerModel<'i> {
    method: &'i ImplItemFn,
    role: Role,
    /// `None` for a timeout, which finds its instance by itself.
    correlation: Option<Correlation>,
    /// `property = "name"`: the correlation value finds the instance through this
    /// correlation property (`#[handle]` only).
    property: Option<LitStr>,
    message_ty: Type,
    /// `T` of a context argument `&mut T` (the compiler checks that it is `SagaContext`).
    context_ty: Option<Type>,
    return_ty: Type,
}

/// The arguments of `#[saga(...)]`.
const SAGA_ARGUMENTS: [&str; 6] = ["name", "version", "migrate", "sends", "publishes", "properties"];
/// What `#[saga(...)]` says.
#[derive(Default)]
struct SagaArguments {
    /// The pinned saga name, if any.
    name: Option<LitStr>,
    /// `version = N` and `migrate = path`.
    versioning: Versioning,
    /// `sends(..)` and `publishes(..)`.
    declared: Declared,
    /// `properties(..)`: the saga's correlation properties.
    properties: Vec<syn::Ident>,
}

/// Reads `#[saga(name = "...", version = N, migrate = path, sends(..), publishes(..))]`.
fn parse_arguments(args: &TokenStream, errors: &mut Vec<syn::Error>) -> SagaArguments {
    let mut declared = Declared::default();
    let mut name: Option<LitStr> = None;
    let mut versioning = Versioning::default();
    let mut properties: Vec<syn::Ident> = Vec::new();
    let mut problems = Vec::new();
    let parser = syn::meta::parser(|meta| {
        if declared.parse(&meta)? {
            return Ok(());
        }
        if meta.path.is_ident("properties") {
            return meta.parse_nested_meta(|inner| {
                let Some(ident) = inner.path.get_ident() else {
                    return Err(syn::Error::new_spanned(
                        &inner.path,
                        "expected the name of a correlation property: `properties(payment_id)`",
                    ));
                };
                if properties.iter().any(|p| p == ident) {
                    problems.push(syn::Error::new_spanned(ident, format!("`{ident}` is declared twice")));
                } else {
                    properties.push(ident.clone());
                }
                Ok(())
            });
        }
        if meta.path.is_ident("name") {
            let lit = string_literal(&meta, "name = \"accounts.SignUp\"")?;
            if name.is_some() {
                return Err(syn::Error::new_spanned(&meta.path, "`name` is given twice"));
            }
            let v = lit.value();
            let problem = if v.is_empty() {
                Some("a saga name cannot be empty")
            } else if v.len() > 200 {
                Some("a saga name is at most 200 characters")
            } else if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
                Some("a saga name cannot contain whitespace or control characters")
            } else {
                None
            };
            match problem {
                Some(p) => problems.push(syn::Error::new(lit.span(), p)),
                None => name = Some(lit),
            }
            Ok(())
        } else if meta.path.is_ident("version") {
            versioning.parse_version(&meta, "saga state")
        } else if meta.path.is_ident("migrate") {
            versioning.parse_step(&meta, "migrate = Self::migrate")
        } else {
            Err(unknown_argument(
                &meta,
                "saga",
                &SAGA_ARGUMENTS,
                "expected `name = \"accounts.SignUp\"` (the saga's stored name), `version = 2` (the version of its \
                 state's shape), `migrate = Self::migrate` (what brings an older state to it), `sends(T, ..)` and \
                 `publishes(T, ..)` (the message types its handlers send, checked against the routes at start), \
                 `properties(name, ..)` (its correlation properties)",
            ))
        }
    });
    if let Err(e) = syn::parse::Parser::parse2(parser, args.clone()) {
        errors.push(e);
    }
    errors.extend(problems);
    versioning.check("migrate", "saga state", errors);
    SagaArguments {
        name,
        versioning,
        declared,
        properties,
    }
}

/// The syntactic checks of a handler method's signature, in the manner of `#[handler]`.
fn check_method<'i>(
    method: &'i ImplItemFn,
    role: Role,
    (correlation, property): (Option<Correlation>, Option<LitStr>),
    errors: &mut Vec<syn::Error>,
) -> Option<HandlerModel<'i>> {
    let before = errors.len();
    let sig = &method.sig;
    if let Some(c) = &sig.constness {
        errors.push(syn::Error::new_spanned(c, "a saga handler cannot be a `const fn`"));
    }
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            "a saga handler must be an `async fn`: write `async fn`",
        ));
    }
    if let Some(u) = &sig.unsafety {
        errors.push(syn::Error::new_spanned(u, "a saga handler cannot be `unsafe`"));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(abi, "a saga handler cannot have an ABI"));
    }
    if !sig.generics.params.is_empty() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "a saga handler cannot be generic: it handles one message type, with no lifetime of its own",
        ));
    }
    if let Some(w) = &sig.generics.where_clause {
        errors.push(syn::Error::new_spanned(
            w,
            "a saga handler cannot have a `where` clause",
        ));
    }
    if let Some(v) = &sig.variadic {
        errors.push(syn::Error::new_spanned(v, "a saga handler cannot be variadic"));
    }
    // The receiver is checked on its own; the other arguments keep their roles without it.
    let mut typed = Vec::new();
    let mut receiver = None;
    for arg in &sig.inputs {
        match arg {
            FnArg::Receiver(r) => receiver = Some(r),
            FnArg::Typed(t) => typed.push(t),
        }
    }
    let shape = if role == Role::NotFound {
        "(message: T, ctx: &mut courier::Context)"
    } else {
        "(&mut self, message: T, ctx: &mut SagaContext<'_>)"
    };
    if let Some(e) = swapped_arguments(&typed, shape) {
        errors.push(e);
        return None;
    }
    match receiver {
        Some(r) if role == Role::NotFound => errors.push(syn::Error::new_spanned(
            r,
            "a not-found handler has no instance, so no state: drop `self`, \
             `async fn f(message: T, ctx: &mut courier::Context)`",
        )),
        None if role == Role::NotFound => {}
        Some(r) => {
            let mutable_ref = matches!(&*r.ty, Type::Reference(t) if t.mutability.is_some());
            if !mutable_ref {
                errors.push(syn::Error::new_spanned(
                    r,
                    "a saga handler changes the saga's state: take `&mut self`",
                ));
            }
        }
        None => errors.push(match typed.first() {
            Some(first) => syn::Error::new_spanned(
                first,
                "a saga handler is a method of the saga's state: its first argument must be `&mut self`",
            ),
            None => syn::Error::new(
                sig.paren_token.span.join(),
                "a saga handler takes `(&mut self, message: T, ctx: &mut SagaContext<'_>)`",
            ),
        }),
    }
    let message_ty = match typed.first().map(|arg| &*arg.ty) {
        Some(Type::Reference(r)) => {
            errors.push(syn::Error::new_spanned(
                r,
                "a saga handler takes the message by value, as its owner: drop the `&`",
            ));
            None
        }
        Some(ty @ Type::ImplTrait(_)) => {
            errors.push(syn::Error::new_spanned(
                ty,
                "a saga handler handles one message type: name it, with no `impl`",
            ));
            None
        }
        Some(ty) => Some(ty.clone()),
        None => {
            if receiver.is_some() || role == Role::NotFound {
                errors.push(syn::Error::new(
                    sig.paren_token.span.join(),
                    "a saga handler takes the message after `&mut self`: `(&mut self, message: T, ctx: &mut SagaContext<'_>)`",
                ));
            }
            None
        }
    };
    let context_ty = match typed.get(1) {
        None => None,
        Some(arg) => match &*arg.ty {
            Type::Reference(r) if r.mutability.is_some() => match &r.lifetime {
                Some(l) if l.ident != "_" => {
                    errors.push(syn::Error::new_spanned(
                        l,
                        "the context is lent to the handler for one call: write `&mut SagaContext<'_>`, with no lifetime",
                    ));
                    None
                }
                _ => Some((*r.elem).clone()),
            },
            other => {
                errors.push(syn::Error::new_spanned(
                    other,
                    "the context argument of a saga handler must be `&mut courier::saga::SagaContext<'_>`",
                ));
                None
            }
        },
    };
    for extra in typed.iter().skip(2) {
        errors.push(syn::Error::new_spanned(
            extra,
            "a saga handler takes at most the message and `ctx: &mut SagaContext<'_>` after `&mut self`",
        ));
    }
    let return_ty = match &sig.output {
        syn::ReturnType::Type(_, ty) => match &**ty {
            Type::ImplTrait(_) | Type::Infer(_) | Type::Never(_) => {
                errors.push(syn::Error::new_spanned(
                    ty,
                    "a saga handler must return `Result<(), E>` where `E` converts into `courier::HandlerError`",
                ));
                None
            }
            ty => Some(ty.clone()),
        },
        syn::ReturnType::Default => {
            errors.push(syn::Error::new_spanned(
                name_and_arguments(sig),
                "a saga handler must return `Result<(), E>` where `E` converts into `courier::HandlerError`: \
                 add `-> Result<(), courier::HandlerError>`",
            ));
            None
        }
    };
    if errors.len() > before {
        return None;
    }
    Some(HandlerModel {
        method,
        role,
        correlation,
        property,
        message_ty: message_ty?,
        context_ty,
        return_ty: return_ty?,
    })
}

/// The attributes of any item of an impl block.
fn attributes(item: &ImplItem) -> &[Attribute] {
    match item {
        ImplItem::Const(c) => &c.attrs,
        ImplItem::Fn(f) => &f.attrs,
        ImplItem::Type(t) => &t.attrs,
        ImplItem::Macro(m) => &m.attrs,
        _ => &[],
    }
}

/// The impl block as it is emitted: the saga's attributes removed from its items.
fn without_roles(item: &ItemImpl) -> ItemImpl {
    let mut item = item.clone();
    for it in &mut item.items {
        let attrs = match it {
            ImplItem::Const(c) => &mut c.attrs,
            ImplItem::Fn(f) => &mut f.attrs,
            ImplItem::Type(t) => &mut t.attrs,
            ImplItem::Macro(m) => &mut m.attrs,
            _ => continue,
        };
        attrs.retain(|a| Role::of(a).is_none() && misspelt_role(a).is_none());
    }
    item
}

/// The handlers of the impl block: every method with a role that passes the checks, and
/// whether one was marked `#[start]` (passing the checks or not).
fn handlers<'i>(item: &'i ItemImpl, errors: &mut Vec<syn::Error>) -> (Vec<HandlerModel<'i>>, bool) {
    let mut out: Vec<HandlerModel<'i>> = Vec::new();
    let mut has_start = false;
    for it in &item.items {
        let ImplItem::Fn(method) = it else {
            for attr in attributes(it).iter().filter(|a| Role::of(a).is_some()) {
                errors.push(syn::Error::new_spanned(
                    attr,
                    "the saga's handlers are methods: this attribute goes on an `async fn` of the impl block",
                ));
            }
            continue;
        };
        for attr in &method.attrs {
            if let Some(role) = misspelt_role(attr) {
                // The start is there, misspelt: "a saga needs a start" would only repeat it.
                has_start |= role == "start";
                let given = attr.path().to_token_stream().to_string();
                errors.push(syn::Error::new_spanned(
                    attr.path(),
                    format!("unknown saga attribute `#[{given}]`: did you mean `#[{role}]`?"),
                ));
            }
        }
        let mut roles = method.attrs.iter().filter_map(|a| Role::of(a).map(|r| (a, r)));
        let Some((attr, role)) = roles.next() else { continue };
        for (again, other) in roles {
            let text = if other == role {
                format!("this method is already marked `#[{}]`", role.name())
            } else {
                format!(
                    "a saga handler has one role: this method is already marked `#[{}]`, it cannot also be `#[{}]`",
                    role.name(),
                    other.name()
                )
            };
            errors.push(syn::Error::new_spanned(again, text));
        }
        has_start |= role == Role::Start;
        let before = errors.len();
        let correlation = parse_role(attr, role, errors);
        let uncorrelated = correlation.0.is_none() && !role.bare();
        if uncorrelated && errors.len() == before {
            errors.push(syn::Error::new_spanned(
                attr,
                format!(
                    "a saga message must say how it finds its instance: `#[{0}(by = field)]` (a field of the \
                     message) or `#[{0}(header = \"name\")]` (a header of the message)",
                    role.name()
                ),
            ));
        }
        let Some(handler) = check_method(method, role, correlation, errors) else {
            continue;
        };
        if uncorrelated {
            // Reported above; its signature was still checked.
            continue;
        }
        // One handler per message type: the endpoint finds the handler by the type, and two
        // correlations for one message could find two different instances.
        let key = handler.message_ty.to_token_stream().to_string();
        let not_found = handler.role == Role::NotFound;
        if let Some(first) = out
            .iter()
            .find(|h| (h.role == Role::NotFound) == not_found && h.message_ty.to_token_stream().to_string() == key)
        {
            errors.push(syn::Error::new_spanned(
                &handler.message_ty,
                format!(
                    "`{}` is already handled by `{}`: a saga handles each message type once (with two handlers, \
                     which correlation would find the instance?)",
                    key.replace(' ', ""),
                    first.method.sig.ident
                ),
            ));
            continue;
        }
        out.push(handler);
    }
    // A not-found handler goes with the `#[handle]` of its message type: only a
    // continuing message can find no instance.
    let types = |h: &HandlerModel<'_>| h.message_ty.to_token_stream().to_string();
    for nf in out.iter().filter(|h| h.role == Role::NotFound) {
        let key = types(nf);
        let partner = out.iter().find(|h| h.role != Role::NotFound && types(h) == key);
        let problem = match partner.map(|h| h.role) {
            Some(Role::Handle) => continue,
            Some(Role::Start) => "it starts an instance when none is found, so it never finds none",
            Some(_) => "it is a timeout, discarded when its instance is gone",
            None => "no `#[handle]` of this saga takes it: add the handler that continues the saga with it",
        };
        errors.push(syn::Error::new_spanned(
            &nf.message_ty,
            format!(
                "`#[not_found]` runs for a `{}` that finds no instance, but {problem}",
                key.replace(' ', "")
            ),
        ));
    }
    (out, has_start)
}

/// The name `#[saga]` gives a state type by default: its last path segment, after the
/// module path of the impl block.
fn type_name(ty: &Type) -> String {
    let tokens = match ty {
        Type::Group(g) => return type_name(&g.elem),
        Type::Paren(p) => return type_name(&p.elem),
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().map(ToTokens::to_token_stream),
        _ => None,
    };
    tokens
        .unwrap_or_else(|| ty.to_token_stream())
        .to_string()
        .replace(' ', "")
}

/// The call `f(args)` of a `__private` function `f` (a path), with the span of a call from
/// `first` to `last`, so that an error about the call (a failed bound of `f`) covers
/// exactly the user's tokens there.
fn call_spanning(f: &TokenStream, args: TokenStream, first: Span, last: Span) -> TokenStream {
    let f = f.clone().into_iter().map(|mut t| {
        t.set_span(first);
        t
    });
    let mut parens = Group::new(Delimiter::Parenthesis, args);
    parens.set_span(last);
    quote!(#(#f)* #parens)
}

/// Generated tokens with the span of a token of the user's, so that an error about an
/// expression they begin (`&message` before the members of a field path) is reported on
/// the user's tokens alone. (A span resolved at the call site instead would make rustc
/// report it on the whole attribute: it does not join spans of two expansions.)
fn relocated(tokens: &TokenStream, first: Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|mut t| {
            t.set_span(first);
            t
        })
        .collect()
}

fn cfgs(method: &ImplItemFn) -> Vec<&Attribute> {
    method.attrs.iter().filter(|a| a.path().is_ident("cfg")).collect()
}

/// The wrapper of a handler method with the signature of a `SagaFn`, and its registration.
fn registration(self_ty: &Type, h: &HandlerModel<'_>) -> TokenStream {
    let method = &h.method.sig.ident;
    let name = LitStr::new(&method.unraw().to_string(), method.span());
    let wrapper = format_ident!("__courier_saga_handler_{}", method.unraw());
    let message_ty = &h.message_ty;
    let return_ty = &h.return_ty;
    let cfgs = cfgs(h.method);
    let not_found = h.role == Role::NotFound;
    // The explicit type arguments below are the user's tokens: a failed bound is reported
    // on them (the context's type, the return type or its parts, the message type).
    let (ctx_param, call) = match (&h.context_ty, not_found) {
        (Some(ty), false) => (
            quote!(ctx),
            quote!(<#self_ty>::#method(state, message, ::courier::__private::saga_context_arg::<#ty>(ctx))),
        ),
        (None, false) => (quote!(_), quote!(<#self_ty>::#method(state, message))),
        (Some(ty), true) => (
            quote!(ctx),
            quote!(<#self_ty>::#method(message, ::courier::__private::context_arg::<#ty>(ctx))),
        ),
        (None, true) => (quote!(_), quote!(<#self_ty>::#method(message))),
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
    // On the method's name: a future that is not `Send` is reported there.
    let boxed = quote_spanned! {method.span()=>
        ::std::boxed::Box::pin(async move { #result })
    };
    // Located at the message type: the call's bound on it is reported there alone.
    let role = match (&h.property, h.role) {
        (Some(_), _) => format_ident!("saga_handle_by_property"),
        (None, role) => format_ident!("saga_{}", role.name()),
    };
    let register = relocated(&quote!(::courier::__private::#role), first_and_last_spans(message_ty).0);
    let property = h.property.as_ref().map(|p| quote!(#p,));
    let correlate = match &h.correlation {
        None => None,
        Some(Correlation::Header(lit)) => Some(quote!(::courier::__private::Correlate::header(#lit))),
        Some(Correlation::By(path)) => {
            let members = &path.members;
            let message = relocated(&quote!(&message), path.first);
            let value = call_spanning(
                &quote!(::courier::__private::correlation_value),
                quote!(#message #(.#members)*),
                path.first,
                path.last,
            );
            Some(quote!(::courier::__private::Correlate::by(|message: &#message_ty| #value)))
        }
    };
    let correlate = correlate.map(|c| quote!(#c,));
    if not_found {
        return quote! {
            #(#cfgs)*
            fn #wrapper<'a>(
                message: #message_ty,
                #ctx_param: &'a mut ::courier::Context,
            ) -> ::courier::BoxFuture<'a, ::core::result::Result<(), ::courier::HandlerError>> {
                #boxed
            }
            #(#cfgs)*
            #register::<_, #message_ty>(handlers, #name, #wrapper);
        };
    }
    quote! {
        #(#cfgs)*
        fn #wrapper<'a, 'b>(
            state: &'a mut #self_ty,
            message: #message_ty,
            #ctx_param: &'a mut ::courier::__private::SagaContext<'b>,
        ) -> ::courier::BoxFuture<'a, ::core::result::Result<(), ::courier::HandlerError>> {
            #boxed
        }
        #(#cfgs)*
        #register::<_, #message_ty>(handlers, #name, #property #correlate #wrapper);
    }
}

/// The check that every `by` field has the type of the first one, reported on the later.
fn same_correlations(handlers: &[HandlerModel<'_>]) -> TokenStream {
    // A field read as a correlation property's value is of the property's type, not the
    // correlation's.
    let mut by = handlers.iter().filter_map(|h| match &h.correlation {
        Some(Correlation::By(path)) if h.property.is_none() => Some((h, path)),
        _ => None,
    });
    let Some((first, first_path)) = by.next() else {
        return TokenStream::new();
    };
    let first_ty = &first.message_ty;
    let first_members = &first_path.members;
    let first_cfgs = cfgs(first.method);
    let checks = by.map(|(later, path)| {
        let later_ty = &later.message_ty;
        let members = &path.members;
        let check = format_ident!("__courier_saga_same_correlation_{}", later.method.sig.ident.unraw());
        let cfgs = cfgs(later.method);
        let first_base = relocated(&quote!(&first), first_path.first);
        let later_base = relocated(&quote!(&later), path.first);
        let call = call_spanning(
            &quote!(::courier::__private::same_correlation),
            quote!(#first_base #(.#first_members)*, #later_base #(.#members)*),
            path.first,
            path.last,
        );
        quote! {
            #(#first_cfgs)*
            #(#cfgs)*
            #[allow(dead_code)]
            fn #check(first: &#first_ty, later: &#later_ty) {
                #call;
            }
        }
    });
    quote!(#(#checks)*)
}

fn generate(item: &ItemImpl, arguments: &SagaArguments, handlers: &[HandlerModel<'_>]) -> TokenStream {
    let self_ty = &item.self_ty;
    let versioning = arguments.versioning.generate("migrate");
    let name = match &arguments.name {
        Some(lit) => quote!(#lit),
        None => {
            let type_name = type_name(self_ty);
            quote!(::core::concat!(::core::module_path!(), "::", #type_name))
        }
    };
    let cfgs: Vec<_> = item.attrs.iter().filter(|a| a.path().is_ident("cfg")).collect();
    let registrations = handlers.iter().map(|h| registration(self_ty, h));
    let checks = same_correlations(handlers);
    let declared_fn = arguments.declared.tokens().map(|d| {
        quote! {
            fn declared() -> ::courier::Declared {
                #d
            }
        }
    });
    quote! {
        #(#cfgs)*
        const _: () = {
            #[automatically_derived]
            impl ::courier::__private::Saga for #self_ty {
                const NAME: &'static str = #name;
                #versioning

                fn register(handlers: &mut ::courier::__private::SagaHandlers<Self>) {
                    #checks
                    #(#registrations)*
                }

                #declared_fn
            }
        };
    }
}

/// Where an error about an item that is not an impl block goes: its first token after
/// its attributes.
fn item_start(item: &Item) -> TokenStream {
    let mut item = item.clone();
    match &mut item {
        Item::Const(i) => i.attrs.clear(),
        Item::Enum(i) => i.attrs.clear(),
        Item::Fn(i) => i.attrs.clear(),
        Item::Mod(i) => i.attrs.clear(),
        Item::Static(i) => i.attrs.clear(),
        Item::Struct(i) => i.attrs.clear(),
        Item::Trait(i) => i.attrs.clear(),
        Item::Type(i) => i.attrs.clear(),
        Item::Union(i) => i.attrs.clear(),
        Item::Use(i) => i.attrs.clear(),
        _ => {}
    }
    item.to_token_stream().into_iter().take(1).collect()
}

pub(crate) fn expand(args: &TokenStream, input: &TokenStream) -> TokenStream {
    let mut errors = Vec::new();
    let arguments = parse_arguments(args, &mut errors);
    let item = match syn::parse2::<Item>(input.clone()) {
        Ok(Item::Impl(item)) => item,
        Ok(other) => {
            errors.push(syn::Error::new_spanned(
                item_start(&other),
                "`#[saga]` goes on the impl block of the saga's state type: `#[courier::saga] impl SignUp { ... }`",
            ));
            let errors = combine(errors).map(|e| e.to_compile_error());
            return quote!(#errors #input);
        }
        Err(e) => {
            errors.push(e);
            let errors = combine(errors).map(|e| e.to_compile_error());
            return quote!(#errors #input);
        }
    };
    let cleaned = without_roles(&item);
    if let Some((_, path, for_token)) = &item.trait_ {
        errors.push(syn::Error::new_spanned(
            quote!(#path #for_token),
            "`#[saga]` goes on an inherent impl block of the saga's state type (`impl SignUp { ... }`), not on a \
             trait impl: it implements `courier::saga::Saga` itself",
        ));
    }
    let generic = !item.generics.params.is_empty() || item.generics.where_clause.is_some();
    if generic {
        let params = &item.generics;
        let where_clause = &item.generics.where_clause;
        errors.push(syn::Error::new_spanned(
            quote!(#params #where_clause),
            "a saga cannot be generic: its instances are stored under one saga name, with one state type",
        ));
    }
    if item.trait_.is_some() || generic {
        let errors = combine(errors).map(|e| e.to_compile_error());
        return quote!(#errors #cleaned);
    }
    let (handlers, has_start) = handlers(&item, &mut errors);
    check_properties(&handlers, &arguments.properties, &mut errors);
    if !has_start {
        errors.push(syn::Error::new_spanned(
            &item.self_ty,
            "a saga needs a start: mark the handler of the message that creates an instance `#[start(by = field)]` \
             or `#[start(header = \"name\")]`",
        ));
    }
    // With errors, the impl is still generated from the handlers that passed the checks,
    // so that their type errors are reported too and the uses of the saga add none.
    let errors = combine(errors).map(|e| e.to_compile_error());
    let generated = generate(&item, &arguments, &handlers);
    let constants = property_constants(&item, &arguments.properties);
    quote! {
        #errors
        #cleaned
        #constants
        #generated
    }
}

/// Every `#[handle(property = name)]` names a property of `#[saga(properties(..))]`.
fn check_properties(handlers: &[HandlerModel<'_>], declared: &[syn::Ident], errors: &mut Vec<syn::Error>) {
    for lit in handlers.iter().filter_map(|h| h.property.as_ref()) {
        let given = lit.value();
        if declared.iter().any(|d| d.unraw() == given) {
            continue;
        }
        let close = declared
            .iter()
            .map(|d| d.unraw().to_string())
            .filter(|d| distance(&given, d) <= 2)
            .min_by_key(|d| distance(&given, d));
        let text = match close {
            Some(known) => format!(
                "`{given}` is not a correlation property of this saga: did you mean `{known}`? (declared with \
                 `#[saga(properties({known}))]`)"
            ),
            None => format!(
                "`{given}` is not a correlation property of this saga: declare it with \
                 `#[saga(properties({given}))]` and set it with `ctx.correlate_by(Self::{}, value)`",
                given.to_uppercase()
            ),
        };
        errors.push(syn::Error::new(lit.span(), text));
    }
}

/// A typed constant per declared correlation property (`payment_id` gives
/// `Self::PAYMENT_ID`), for `SagaContext::correlate_by`.
fn property_constants(item: &ItemImpl, declared: &[syn::Ident]) -> Option<TokenStream> {
    if declared.is_empty() {
        return None;
    }
    let self_ty = &item.self_ty;
    let cfgs: Vec<_> = item.attrs.iter().filter(|a| a.path().is_ident("cfg")).collect();
    let constants = declared.iter().map(|d| {
        let name = d.unraw().to_string();
        let constant = format_ident!("{}", name.to_uppercase(), span = d.span());
        let doc = format!("The correlation property `{name}` of this saga (`#[saga(properties({name}))]`).");
        let lit = LitStr::new(&name, d.span());
        quote! {
            #[doc = #doc]
            pub const #constant: ::courier::saga::Property = ::courier::saga::Property::new(#lit);
        }
    });
    Some(quote! {
        #(#cfgs)*
        impl #self_ty {
            #(#constants)*
        }
    })
}
