//! The handlers of an endpoint, registered and indexed: each handler with its message
//! type erased ([`ErasedHandler`]), grouped by message type ([`TypeEntry`]) and indexed by
//! wire name and alias ([`Registry`]), which the runtime looks a received message's
//! handlers up in. A message type handled by a batch handler has its batch route here
//! too (`batch.rs` is the handler's side, `runtime/batcher.rs` the collecting).

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::Arc;

use super::batch::ErasedBatch;
use super::context;
use super::handler::{BoxFuture, Handler, Message};
use super::{Failure, otel};
use crate::error::{Error, ErrorKind, Result};

/// A handler with its message type erased.
pub(crate) trait ErasedHandler: Send + Sync {
    fn name(&self) -> &'static str;
    /// The saga whose handler this is (`None`: a plain handler). A saga's copy of a
    /// message it tries again (`not_found_seal.rs`) runs that saga's handler only.
    fn saga(&self) -> Option<&'static str> {
        None
    }
    fn call<'a>(&'a self, ctx: &'a mut context::Context) -> BoxFuture<'a, Result<(), Failure>>;
}

pub(super) struct Erased<H>(pub(super) H);

impl<H: Handler> ErasedHandler for Erased<H> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn call<'a>(&'a self, ctx: &'a mut context::Context) -> BoxFuture<'a, Result<(), Failure>> {
        let span = otel::handle_span(self.0.name(), <H::Message as Message>::NAME);
        Box::pin(otel::in_span(span, async move {
            let message = crate::endpoint::version::decode_message::<H::Message>(&ctx.received().envelope)?;
            let name = self.0.name();
            self.0
                .handle(message, ctx)
                .await
                .map_err(|error| Failure::Handler { handler: name, error })
        }))
    }
}

/// The handlers of one message type.
pub(crate) struct TypeEntry {
    pub(crate) name: &'static str,
    pub(crate) handlers: Arc<[Arc<dyn ErasedHandler>]>,
    /// The type's batch handler, when it has one (then it has no other handler).
    pub(crate) batch: Option<Arc<BatchRoute>>,
}

/// A batch handler and the batch it is collecting (`runtime/batcher.rs`).
pub(crate) struct BatchRoute {
    pub(crate) handler: Arc<dyn ErasedBatch>,
    pub(crate) collecting: crate::endpoint::runtime::Collecting,
}

/// A registered handler: of one message, or of batches.
pub(super) enum Handling {
    One(Arc<dyn ErasedHandler>),
    Batch(Arc<dyn ErasedBatch>),
}

/// The handlers of an endpoint, by wire name (aliases included) and by type.
#[derive(Default)]
pub(super) struct Registry {
    pub(super) by_name: HashMap<String, Arc<TypeEntry>>,
    pub(super) entries: Vec<Arc<TypeEntry>>,
}

pub(super) struct Registration {
    pub(super) type_id: TypeId,
    pub(super) type_name: &'static str,
    pub(super) name: &'static str,
    pub(super) aliases: &'static [&'static str],
    pub(super) handler: Handling,
}

/// Groups the handlers by message type and indexes them by wire name and alias.
pub(super) fn registry(registrations: Vec<Registration>) -> Result<Registry> {
    struct Group {
        type_id: TypeId,
        type_name: &'static str,
        name: &'static str,
        aliases: &'static [&'static str],
        handlers: Vec<Arc<dyn ErasedHandler>>,
        batches: Vec<Arc<dyn ErasedBatch>>,
    }
    let mut groups: Vec<Group> = Vec::new();
    for r in registrations {
        let at = match groups.iter().position(|g| g.type_id == r.type_id) {
            Some(at) => at,
            None => {
                groups.push(Group {
                    type_id: r.type_id,
                    type_name: r.type_name,
                    name: r.name,
                    aliases: r.aliases,
                    handlers: Vec::new(),
                    batches: Vec::new(),
                });
                groups.len() - 1
            }
        };
        if let Some(g) = groups.get_mut(at) {
            match r.handler {
                Handling::One(h) => g.handlers.push(h),
                Handling::Batch(b) => g.batches.push(b),
            }
        }
    }
    let mut registry = Registry::default();
    let mut owners: HashMap<&'static str, &'static str> = HashMap::new();
    for g in groups {
        let batch = match (g.batches.as_slice(), g.handlers.len()) {
            ([], _) => None,
            ([one], 0) => Some(Arc::new(BatchRoute {
                handler: one.clone(),
                collecting: crate::endpoint::runtime::Collecting::new(one.options().concurrency),
            })),
            ([one], _) => {
                return Err(Error::new(ErrorKind::InvalidOptions {
                    reason: format!(
                        "{} has the batch handler {} and other handlers: a message type with a batch handler has no \
                         other handler (handle it in the batch, or send it on to another endpoint)",
                        g.type_name,
                        one.name()
                    ),
                }));
            }
            (many, _) => {
                let names: Vec<&str> = many.iter().map(|b| b.name()).collect();
                return Err(Error::new(ErrorKind::InvalidOptions {
                    reason: format!(
                        "{} has several batch handlers ({}): give it one",
                        g.type_name,
                        names.join(", ")
                    ),
                }));
            }
        };
        let entry = Arc::new(TypeEntry {
            name: g.name,
            handlers: g.handlers.into(),
            batch,
        });
        for wire in std::iter::once(g.name).chain(g.aliases.iter().copied()) {
            if let Some(other) = owners.insert(wire, g.type_name) {
                return Err(Error::new(ErrorKind::InvalidOptions {
                    reason: format!("the wire name {wire:?} belongs to both {other} and {}", g.type_name),
                }));
            }
            registry.by_name.insert(wire.to_owned(), entry.clone());
        }
        registry.entries.push(entry);
    }
    Ok(registry)
}
