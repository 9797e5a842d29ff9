//! Courier: message workflows for Rust.
//!
//! This crate holds the message model ([`Envelope`], [`ReceivedMessage`]), the transport
//! contract ([`Transport`], [`Sender`], [`Receiver`], [`Delivery`]) that every broker
//! implements rule by rule (see `docs/semantics.md`), time ([`Clock`]), and the embedded
//! broker ([`Embedded`]), an in-process broker kept in SQLite that needs no server.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use courier::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), courier::Error> {
//! let broker = Embedded::in_memory().await?;
//! broker.create_queue("billing", &QueueOptions::default()).await?;
//! let sender = broker.sender("billing", SenderOptions::default()).await?;
//! sender.send(Envelope::new("hello")).await?;
//!
//! let receiver = broker.receiver(&EntityPath::queue("billing")).await?;
//! for delivery in receiver.receive(10, Duration::from_secs(1)).await? {
//!     assert_eq!(delivery.message().body().as_ref(), b"hello");
//!     delivery.complete().await?;
//! }
//! # Ok(())
//! # }
//! ```

#[allow(unused_extern_crates)]
extern crate self as courier;

/// The project's pages: every Rust snippet of `README.md` and `docs/` is compiled (and
/// run, unless it is marked `no_run` because it needs a server or runs until Ctrl-C) as a
/// doc test, so a page cannot show code that does not build.
#[cfg(all(doctest, feature = "postgres", feature = "amqp"))]
mod pages {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../docs/endpoints.md")]
    struct Endpoints;
    #[doc = include_str!("../../docs/sagas.md")]
    struct Sagas;
    #[doc = include_str!("../../docs/stores.md")]
    struct Stores;
    #[doc = include_str!("../../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../../docs/rabbitmq.md")]
    struct Rabbitmq;
    #[doc = include_str!("../../docs/embedded-broker.md")]
    struct EmbeddedBroker;
    #[doc = include_str!("../../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../../docs/semantics.md")]
    struct Semantics;
    #[doc = include_str!("../../docs/observability.md")]
    struct Observability;
    #[doc = include_str!("../../docs/reliability.md")]
    struct Reliability;
    #[doc = include_str!("../../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../../docs/postgres.md")]
    struct Postgres;
    #[doc = include_str!("../../docs/postgres-reference.md")]
    struct PostgresReference;
    #[doc = include_str!("../../docs/measurements.md")]
    struct Measurements;
    #[doc = include_str!("../../docs/containers.md")]
    struct Containers;
}

/// Every page of `docs/` is among the compiled pages above: a new page cannot show code
/// that nobody builds.
#[cfg(test)]
mod pages_listed {
    #[test]
    fn every_page_of_docs_is_compiled() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap_or_default();
        let mut missing = Vec::new();
        let pages = std::fs::read_dir(root.join("../docs")).map(|d| d.flatten().collect::<Vec<_>>());
        let pages = pages.unwrap_or_default();
        assert!(!pages.is_empty(), "docs/ is next to framework/");
        for page in pages {
            let name = page.file_name().to_string_lossy().into_owned();
            let listed = format!("include_str!(\"../../docs/{name}\")");
            if name.ends_with(".md") && !lib.contains(&listed) {
                missing.push(name);
            }
        }
        assert!(
            missing.is_empty(),
            "add these pages to `mod pages` in lib.rs: {missing:?}"
        );
    }
}

pub mod admin;
mod checks;
mod clock;
mod codec;
mod endpoint;
mod entity;
mod error;
#[cfg(test)]
mod fuzz;
mod loglimit;
mod logtext;
mod message;
pub mod saga;
mod store;
mod transport;
pub mod version;

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "sqlite")]
mod embedded;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub mod test_servers;
#[cfg(feature = "sqlite")]
pub mod testing;

#[cfg(feature = "conformance")]
#[path = "suite.rs"]
pub mod conformance;

pub use checks::{DEFAULT_MAX_MESSAGE_SIZE, MAX_MESSAGE_ID_LEN};
pub use clock::{Clock, Sleep, SystemClock, VirtualClock};
pub use codec::{Codec, CodecError, JsonCodec};
pub use courier_macros::{Message, handler, saga};
pub use endpoint::bus::{Bus, SendOptions};
pub use endpoint::context::Context;
pub use endpoint::handler::{BoxFuture, Declared, Handler, HandlerError, Message, ResultExt};

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
pub use endpoint::recoverability::RetryPolicy;
pub use endpoint::routing::{Routes, default_topic_name};
pub use endpoint::trace::{TRACEPARENT, TRACESTATE, TraceContext};
pub use endpoint::{
    DEFAULT_CONCURRENCY, DEFAULT_GROUP_COMMIT, DEFAULT_MAX_LOCK_RENEWAL, DEFAULT_MAX_TIMEOUT_DISPATCHES,
    DEFAULT_RECEIVE_WAIT, DEFAULT_SHUTDOWN_TIMEOUT, Endpoint, EndpointBuilder, EndpointStats, IntoStore, IntoTransport,
    RunningEndpoint, ShutdownReport,
};
pub use entity::{
    EntityCounts, EntityPath, MAX_LOCK_DURATION, MAX_NAME_LEN, MAX_TIME_TO_LIVE, QueueOptions, SubQueue,
    SubscriptionOptions, TopicOptions, validate_name,
};
/// The `serde_json` Courier is built with: upcasters ([`Message::upcast`]) and saga state
/// migrations ([`saga::Saga::migrate`]) take and return its `Value`.
#[doc(no_inline)]
pub use serde_json;
/// The `sqlx` Courier is built with: [`Context::transaction`] takes its database types
/// (`courier::sqlx::Postgres`, `courier::sqlx::Sqlite`), so use this one rather than a
/// version of your own that may differ.
#[doc(no_inline)]
pub use sqlx;

/// What the endpoint writes on messages it retries or dead-letters: the dead-letter
/// reasons and the failure headers. (The broker's own reasons are in [`reasons`].)
pub mod recoverability {
    pub use crate::endpoint::recoverability::{RetryPolicy, headers, reasons};
}
/// The metrics endpoints emit through the [`metrics`] facade: their names and
/// label keys (see docs/observability.md). Install a recorder before starting endpoints.
pub mod observability {
    pub use crate::endpoint::metrics::{UNKNOWN_TYPE, labels, names};
}
pub use error::{BoxError, Error, ErrorKind, Result};
pub use message::{
    BrokerProperties, Envelope, LockToken, MessageState, Properties, PropertyValue, ReceivedMessage, SequenceNumber,
    reasons,
};
/// The sending half of the contract (re-exported under its own name to keep `Sender`
/// free for applications).
pub use transport::Sender;
pub use transport::{
    BentRule, Capabilities, DEFAULT_MAX_IN_FLIGHT, Delivery, Receiver, SendError, SenderOptions, SessionReceiver,
    SessionSelector, Settlement, Settler, Transport,
};
pub use version::UpcastError;

#[cfg(feature = "amqp")]
pub use amqp::{AmqpBuilder, AmqpTransport, DEFAULT_CONNECT_TIMEOUT, ScheduleStore, WireStats};
#[cfg(feature = "sqlite")]
pub use embedded::{DEFAULT_READ_CONNECTIONS, Durability, Embedded, EmbeddedBuilder, EmbeddedStore};
#[cfg(feature = "postgres")]
pub use postgres::{DEFAULT_PG_POLL_INTERVAL, PgTransportBuilder, PgTransportStore, PostgresTransport};
#[cfg(feature = "postgres")]
pub use store::PostgresStore;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::{
    Begin, CommitGroup, Committed, DEFAULT_INBOX_RETENTION, DueTimeouts, EndpointSecret, OutboxDeadLetter,
    OutboxMessage, Store, StoreBacklog, StoredSaga, Timeout, TimeoutClaim, UnitOfWork, UnitOfWorkScope,
};

/// The names most programs need: `use courier::prelude::*;`.
pub mod prelude {
    #[cfg(feature = "sqlite")]
    pub use crate::Embedded;
    pub use crate::{
        Bus, Context, Endpoint, Handler, HandlerError, Message, ResultExt, RetryPolicy, Routes, SendOptions, handler,
    };
    pub use crate::{
        Clock, Codec, Delivery, EntityPath, Envelope, JsonCodec, QueueOptions, ReceivedMessage, Receiver, Sender,
        SenderOptions, SessionReceiver, SessionSelector, Settlement, SystemClock, TopicOptions, Transport,
        VirtualClock,
    };
}
