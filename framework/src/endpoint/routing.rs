//! Where messages go: which queue a command is sent to, which types are events.

use std::collections::BTreeMap;

use crate::endpoint::handler::Message;
use crate::entity::{EntityPath, MAX_NAME_LEN, validate_name};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::Transport;

/// The routing table shared by the endpoints and buses of an application.
///
/// A command type is sent to one queue (its owner's input queue); an event type is
/// published to a topic and every endpoint with a handler for it receives a copy through
/// its own subscription. Types are named by their wire name ([`Message::NAME`]).
///
/// # Examples
///
/// ```
/// use courier::Routes;
/// # #[derive(serde::Serialize, serde::Deserialize, courier::Message)]
/// # struct PlaceOrder;
/// # #[derive(serde::Serialize, serde::Deserialize, courier::Message)]
/// # struct OrderPlaced;
/// let routes = Routes::new().send::<PlaceOrder>("sales").event::<OrderPlaced>();
/// assert_eq!(routes.queue_of("courier::routing::PlaceOrder").is_none(), true);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    commands: BTreeMap<&'static str, String>,
    events: BTreeMap<&'static str, String>,
}

impl Routes {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends messages of type `M` to `queue`.
    #[must_use]
    pub fn send<M: Message>(mut self, queue: impl Into<String>) -> Self {
        self.commands.insert(M::NAME, queue.into());
        self
    }

    /// Declares `M` an event, published to the topic [`default_topic_name`] gives.
    #[must_use]
    pub fn event<M: Message>(self) -> Self {
        let topic = default_topic_name(M::NAME);
        self.event_on::<M>(topic)
    }

    /// Declares `M` an event, published to `topic`.
    #[must_use]
    pub fn event_on<M: Message>(mut self, topic: impl Into<String>) -> Self {
        self.events.insert(M::NAME, topic.into());
        self
    }

    /// The queue commands of this wire name are sent to.
    pub fn queue_of(&self, message_type: &str) -> Option<&str> {
        self.commands.get(message_type).map(String::as_str)
    }

    /// The topic events of this wire name are published to.
    pub fn topic_of(&self, message_type: &str) -> Option<&str> {
        self.events.get(message_type).map(String::as_str)
    }

    /// The command queues, by wire name.
    pub fn commands(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.commands.iter().map(|(k, v)| (*k, v.as_str()))
    }

    /// The event topics, by wire name.
    pub fn events(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.events.iter().map(|(k, v)| (*k, v.as_str()))
    }

    /// Checks every queue and topic name, and that no type is both a command and an event.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidEntityName`] or [`ErrorKind::InvalidOptions`].
    pub fn validate(&self) -> Result<()> {
        for name in self.commands.values().chain(self.events.values()) {
            validate_name(name)?;
        }
        if let Some(both) = self.commands.keys().find(|k| self.events.contains_key(*k)) {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: format!("message type {both} is routed both as a command and as an event"),
            }));
        }
        Ok(())
    }
}

/// The topic an event type is published to unless [`Routes::event_on`] names one: its
/// wire name with `::` turned into `.` and other characters a name cannot hold into `-`
/// (`shop::OrderPlaced` becomes `shop.OrderPlaced`), cut to the name length limit.
pub fn default_topic_name(message_type: &str) -> String {
    let mut out = String::with_capacity(message_type.len());
    let mut rest = message_type;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("::") {
            out.push('.');
            rest = after;
            continue;
        }
        out.push(if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '-'
        });
        rest = &rest[c.len_utf8()..];
    }
    let trimmed = out.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut name: String = trimmed.chars().take(MAX_NAME_LEN).collect();
    if name.is_empty() {
        name.push_str("events");
    }
    name
}

/// What the routes of endpoint `endpoint` miss of what its handlers and sagas declared
/// they send (`declared`: each one's name and types), as one text that names every
/// missing route and how to add it; `None` when nothing is missing.
pub(crate) fn missing_routes(
    endpoint: &str,
    routes: &Routes,
    declared: &[(&'static str, crate::endpoint::handler::Declared)],
) -> Option<String> {
    let mut missing: Vec<String> = Vec::new();
    for (owner, d) in declared {
        for name in &d.sends {
            if routes.queue_of(name).is_none() {
                missing.push(format!("{owner} sends {name}: add Routes::send::<T>(queue) for it"));
            }
        }
        for name in &d.publishes {
            if routes.topic_of(name).is_none() {
                missing.push(format!("{owner} publishes {name}: add Routes::event::<T>() for it"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    (!missing.is_empty()).then(|| {
        format!(
            "endpoint {endpoint} cannot start: {} message type(s) its handlers declare have no route: {}",
            missing.len(),
            missing.join("; ")
        )
    })
}

/// Logs a warning at the start of endpoint `endpoint` that lists the queues its routes
/// send to and that do not exist (each with the types routed to it): a send to one fails
/// the handling, which is retried until the queue exists. Only what the transport can
/// tell: a queue whose lookup fails otherwise is not listed. The endpoint's own queue
/// exists (it was just created).
pub(crate) async fn warn_missing_queues(transport: &dyn Transport, endpoint: &str, routes: &Routes) {
    let mut queues: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, queue) in routes.commands() {
        if queue != endpoint {
            queues.entry(queue).or_default().push(name);
        }
    }
    let mut missing = Vec::new();
    for (queue, types) in queues {
        match transport.counts(&EntityPath::queue(queue)).await {
            Err(e) if matches!(e.kind(), ErrorKind::EntityNotFound { .. }) => {
                missing.push(format!("`{queue}` (for {})", types.join(", ")));
            }
            Err(e) => tracing::debug!(queue, error = %e, "could not check that a routed queue exists"),
            Ok(_) => {}
        }
    }
    if !missing.is_empty() {
        tracing::warn!(
            endpoint,
            missing = %missing.join(", "),
            "routed destination queues do not exist: {}. A handling that sends to one fails and is retried \
             until it exists: create each (an endpoint creates its own queue when it starts: start the \
             endpoint that receives from it, or create it with Transport::create_queue)",
            missing.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_topic_names_are_valid_entity_names() {
        assert_eq!(default_topic_name("shop::OrderPlaced"), "shop.OrderPlaced");
        assert_eq!(default_topic_name("billing.InvoicePaid"), "billing.InvoicePaid");
        assert_eq!(default_topic_name("a::b<c::D>"), "a.b-c.D-");
        assert_eq!(default_topic_name("::x"), "x");
        assert_eq!(default_topic_name("ü"), "events");
        let long = "a".repeat(300);
        assert_eq!(default_topic_name(&long).len(), MAX_NAME_LEN);
        for n in ["shop::OrderPlaced", "a::b<c::D>", "::x"] {
            assert!(validate_name(&default_topic_name(n)).is_ok(), "{n}");
        }
    }
}
