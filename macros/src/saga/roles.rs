//! The attributes on a saga's methods: their roles (`#[start]`, `#[handle]`,
//! `#[timeout]`, `#[not_found]`, and misspellings of them) and how a message finds its
//! instance (`by = field`, `header = "name"`, `property = name`), parsed and checked,
//! each error on its tokens.

use proc_macro2::Span;
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::{Attribute, Expr, ExprLit, Index, Lit, LitStr, Member, Meta};

use crate::handler::first_and_last_spans;
use crate::message::{distance, string_literal};

/// What a handler does with its saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Start,
    Handle,
    Timeout,
    NotFound,
}

impl Role {
    /// The role an attribute of a method gives it, if it is one of the saga's.
    pub(super) fn of(attr: &Attribute) -> Option<Self> {
        let path = attr.path();
        if path.is_ident("start") {
            Some(Self::Start)
        } else if path.is_ident("handle") {
            Some(Self::Handle)
        } else if path.is_ident("timeout") {
            Some(Self::Timeout)
        } else if path.is_ident("not_found") {
            Some(Self::NotFound)
        } else {
            None
        }
    }

    /// The attribute's name, which is also the `SagaHandlers` method that registers it
    /// (through `__private::saga_<name>`).
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Handle => "handle",
            Self::Timeout => "timeout",
            Self::NotFound => "not_found",
        }
    }

    /// Whether it takes no arguments (it finds no instance by a correlation).
    pub(super) fn bare(self) -> bool {
        matches!(self, Self::Timeout | Self::NotFound)
    }
}

/// The roles, for suggestions when an attribute is misspelt.
pub(super) const ROLES: [&str; 4] = ["start", "handle", "timeout", "not_found"];

/// Attributes of Rust and of common crates that are not misspelt roles, however close.
pub(super) const NOT_ROLES: [&str; 6] = ["cfg", "doc", "allow", "inline", "instrument", "deprecated"];

/// A method attribute that looks like a misspelt role (`#[starts]`), with the role.
pub(super) fn misspelt_role(attr: &Attribute) -> Option<&'static str> {
    let ident = attr.path().get_ident()?.to_string();
    if NOT_ROLES.contains(&ident.as_str()) || ROLES.contains(&ident.as_str()) {
        return None;
    }
    let plain = ident.to_lowercase().replace('_', "");
    ROLES
        .iter()
        .find(|r| {
            let role = r.replace('_', "");
            plain == role || plain.trim_end_matches('s') == role || plain.trim_end_matches("ed") == role
        })
        .copied()
        .or_else(|| did_you_mean(&ident.to_lowercase(), &ROLES))
}

/// A field of the message, maybe nested: `by = order.id`.
pub(super) struct FieldPath {
    pub(super) members: Vec<Member>,
    /// The first and the last token as written, where errors about the field go.
    pub(super) first: Span,
    pub(super) last: Span,
}

/// How a message finds its saga instance.
pub(super) enum Correlation {
    By(FieldPath),
    Header(LitStr),
}

/// The arguments of `#[start(...)]` and `#[handle(...)]`.
pub(super) const CORRELATIONS: [&str; 3] = ["by", "header", "property"];

/// The known word closest to `given`, if it is close enough to be a typo of it.
fn did_you_mean(given: &str, known: &[&'static str]) -> Option<&'static str> {
    known
        .iter()
        .map(|k| (distance(given, k), *k))
        .filter(|(d, k)| !given.is_empty() && *d <= 2 && *d < k.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

pub(super) fn unknown_argument(
    meta: &ParseNestedMeta<'_>,
    attribute: &str,
    known: &[&'static str],
    expected: &str,
) -> syn::Error {
    let given = meta.path.get_ident().map(ToString::to_string).unwrap_or_default();
    match did_you_mean(&given, known) {
        Some(k) => meta.error(format!(
            "unknown argument `{given}` of `#[{attribute}]`: did you mean `{k}`?"
        )),
        None => meta.error(format!("unknown argument of `#[{attribute}]`: {expected}")),
    }
}

/// `by = user_id`, `by = order.id`, `by = 0`: pushes the members of a field path to `out`;
/// `false` if the expression is not one.
pub(super) fn field_path(expr: &Expr, out: &mut Vec<Member>) -> bool {
    match expr {
        Expr::Path(p) if p.attrs.is_empty() && p.qself.is_none() => match p.path.get_ident() {
            Some(ident) if ident != "self" => {
                out.push(Member::Named(ident.clone()));
                true
            }
            _ => false,
        },
        Expr::Field(f) if f.attrs.is_empty() => {
            let base = field_path(&f.base, out);
            out.push(f.member.clone());
            base
        }
        Expr::Lit(ExprLit {
            lit: Lit::Int(i),
            attrs,
        }) if attrs.is_empty() && i.suffix().is_empty() => match i.base10_parse::<u32>() {
            Ok(index) => {
                out.push(Member::Unnamed(Index { index, span: i.span() }));
                true
            }
            Err(_) => false,
        },
        _ => false,
    }
}

/// The value of `property = name` (or the older `property = "name"`), as a string literal
/// spanned on the user's token.
fn property_name(meta: &ParseNestedMeta<'_>) -> syn::Result<LitStr> {
    let expr: Expr = meta.value()?.parse()?;
    match expr {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Ok(s),
        Expr::Path(p) if p.attrs.is_empty() && p.qself.is_none() => match p.path.get_ident() {
            Some(i) => Ok(LitStr::new(&i.unraw().to_string(), i.span())),
            None => Err(syn::Error::new_spanned(p, PROPERTY_EXPECTED)),
        },
        other => Err(syn::Error::new_spanned(other, PROPERTY_EXPECTED)),
    }
}

/// The error on a `property = ..` that is not a name.
const PROPERTY_EXPECTED: &str =
    "expected the name of a correlation property declared with `#[saga(properties(..))]`: `property = payment_id`";

/// Reads the correlation of a `#[start]`, `#[handle]` or `#[timeout]` attribute. Problems
/// go to `errors`; a start or a continuation with no correlation is reported by the caller,
/// unless the attribute had errors of its own.
pub(super) fn parse_role(
    attr: &Attribute,
    role: Role,
    errors: &mut Vec<syn::Error>,
) -> (Option<Correlation>, Option<LitStr>) {
    let list = match &attr.meta {
        Meta::Path(_) => return (None, None),
        Meta::NameValue(nv) => {
            errors.push(syn::Error::new_spanned(
                nv,
                match role {
                    r if r.bare() => format!("`#[{}]` takes no value", r.name()),
                    r => format!(
                        "write the correlation in parentheses: `#[{0}(by = field)]` or `#[{0}(header = \"name\")]`",
                        r.name()
                    ),
                },
            ));
            return (None, None);
        }
        Meta::List(list) => list,
    };
    let mut correlation: Option<Correlation> = None;
    let mut property: Option<LitStr> = None;
    let mut problems = Vec::new();
    let result = list.parse_nested_meta(|meta| {
        let is_by = meta.path.is_ident("by");
        if role == Role::NotFound {
            return Err(meta.error(
                "`#[not_found]` takes no arguments: it handles the messages of its type that found no instance",
            ));
        }
        if meta.path.is_ident("property") && role != Role::Timeout {
            let lit = property_name(&meta)?;
            if role != Role::Handle {
                problems.push(syn::Error::new_spanned(
                    &meta.path,
                    "only `#[handle]` finds its instance by a correlation property: a start message creates the \
                     instance under its correlation",
                ));
            } else if lit.value().is_empty() {
                problems.push(syn::Error::new(lit.span(), "a property name cannot be empty"));
            } else if property.is_some() {
                problems.push(syn::Error::new_spanned(&meta.path, "`property` is given twice"));
            } else {
                property = Some(lit);
            }
            return Ok(());
        }
        if !is_by && !meta.path.is_ident("header") {
            return Err(match role {
                Role::Timeout => meta.error(
                    "`#[timeout]` takes no arguments: a timeout finds its instance by itself (it was requested \
                     with `SagaContext::request_timeout`)",
                ),
                Role::Handle => unknown_argument(
                    &meta,
                    "handle",
                    &CORRELATIONS,
                    "expected `by = field` (a field of the message) or `header = \"name\"` (a header of the \
                     message), and maybe `property = name` (a correlation property the value finds the \
                     instance by, declared with `#[saga(properties(name))]`)",
                ),
                r => unknown_argument(
                    &meta,
                    r.name(),
                    &CORRELATIONS[..2],
                    "expected `by = field` (a field of the message) or `header = \"name\"` (a header of the message)",
                ),
            });
        }
        let (new, tokens) = if is_by {
            let expr: Expr = meta.value()?.parse()?;
            let mut members = Vec::new();
            if !field_path(&expr, &mut members) {
                return Err(syn::Error::new_spanned(
                    &expr,
                    "expected a field of the message: `by = user_id`, or a nested one: `by = order.id`",
                ));
            }
            let (first, last) = first_and_last_spans(&expr);
            (
                Correlation::By(FieldPath { members, first, last }),
                expr.to_token_stream(),
            )
        } else {
            let lit = string_literal(&meta, "header = \"x-user-id\"")?;
            if lit.value().is_empty() {
                problems.push(syn::Error::new(lit.span(), "a header name cannot be empty"));
            }
            (Correlation::Header(lit.clone()), lit.to_token_stream())
        };
        let path = &meta.path;
        if role == Role::Timeout {
            problems.push(syn::Error::new_spanned(
                quote!(#path = #tokens),
                "a timeout takes no correlation: it finds its instance by itself (it was requested with \
                 `SagaContext::request_timeout`); write `#[timeout]`",
            ));
            return Ok(());
        }
        match (&correlation, &new) {
            (None, _) => correlation = Some(new),
            (Some(Correlation::By(_)), Correlation::By(_)) => {
                problems.push(syn::Error::new_spanned(path, "`by` is given twice"));
            }
            (Some(Correlation::Header(_)), Correlation::Header(_)) => {
                problems.push(syn::Error::new_spanned(path, "`header` is given twice"));
            }
            _ => problems.push(syn::Error::new_spanned(
                quote!(#path = #tokens),
                "a message finds its instance one way: by a field (`by`) or by a header (`header`), not both",
            )),
        }
        Ok(())
    });
    if let Err(e) = result {
        errors.push(e);
    }
    if property.is_some() && correlation.is_none() {
        problems.push(syn::Error::new_spanned(
            list,
            "`property` names the instance's property; say where the message's value is: \
             `#[handle(by = field, property = name)]`",
        ));
    }
    errors.extend(problems);
    (correlation, property)
}
