//! Courier: message workflows for Rust.
//!
//! Handlers and sagas are plain async functions. An [`Endpoint`] receives their messages
//! from a [`Transport`] (the [`Embedded`] broker in a SQLite file by default, RabbitMQ with
//! the feature `amqp`, Postgres with `postgres`), runs them, retries what fails and
//! dead-letters what cannot succeed; with a [`Store`], each message's effects happen once.
//! This page is a tour in four steps; the guides are listed [at the end](#guides).
//!
//! # 1. A handler on an endpoint
//!
//! A message is a serde type with a stable wire name ([`Message`], derived). A handler
//! takes one and a [`Context`], through which it sends, publishes and writes in the
//! store's transaction; what it sends leaves only if it succeeds. An endpoint is a named
//! input queue with its handlers, and [`Routes`] say where each message type goes:
//!
//! ```no_run
//! use courier::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, courier::Message)]
//! #[message(name = "shop.PlaceOrder")]
//! struct PlaceOrder { id: String }
//!
//! #[derive(Serialize, Deserialize, courier::Message)]
//! #[message(name = "shop.OrderPlaced")]
//! struct OrderPlaced { id: String }
//!
//! #[courier::handler]
//! async fn place(msg: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
//!     ctx.publish(&OrderPlaced { id: msg.id })?;      // an event: to every subscriber
//!     Ok(())                                          // an Err is retried, then dead-lettered
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let broker = Embedded::open("shop.db").await?;
//!     let routes = Routes::new().send::<PlaceOrder>("orders").event::<OrderPlaced>();
//!     let orders = Endpoint::builder("orders")
//!         .transport(broker.clone())
//!         .store(broker.store())                      // effects once, in the same file
//!         .routes(routes)
//!         .handler(place)
//!         .start()
//!         .await?;
//!     orders.bus().send(&PlaceOrder { id: "o-1".into() }).await?;
//!     orders.run_until(tokio::signal::ctrl_c()).await?;  // then a graceful shutdown
//!     Ok(())
//! }
//! ```
//!
//! [`EndpointBuilder`] lists the options (concurrency, retries, state shared with
//! handlers, ...); [`RunningEndpoint`] is what `start` returns.
//!
//! # 2. A saga with a timeout
//!
//! A saga is a workflow with state: a serde type kept in the endpoint's store, one instance
//! per correlation value, with handlers for the messages that start it, continue it and
//! time it out. `#[courier::saga]` on its `impl` block wires them; a timeout is a message
//! the saga sends itself, stored with the instance, that fires once or never
//! ([`saga::SagaContext::request_timeout`]). This one cancels an order not paid within 30
//! minutes:
//!
//! ```
//! use std::time::Duration;
//!
//! use courier::saga::SagaContext;
//! use courier::HandlerError;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, courier::Message)]
//! struct OrderPlaced { id: String }
//! #[derive(Serialize, Deserialize, courier::Message)]
//! struct PaymentReceived { order: String }
//! #[derive(Serialize, Deserialize, courier::Message)]
//! struct PaymentTimedOut;
//! #[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
//! struct CancelOrder { id: String }
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct Checkout { order: String }
//!
//! #[courier::saga]
//! impl Checkout {
//!     #[start(by = id)]                                // OrderPlaced.id names the instance
//!     async fn placed(&mut self, m: OrderPlaced, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//!         self.order = m.id;
//!         ctx.request_timeout(Duration::from_secs(30 * 60), &PaymentTimedOut)?;
//!         Ok(())
//!     }
//!
//!     #[handle(by = order)]                            // PaymentReceived.order finds it
//!     async fn paid(&mut self, _m: PaymentReceived, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//!         ctx.complete();                              // deletes the instance and its timeout
//!         Ok(())
//!     }
//!
//!     #[timeout]                                       // finds its instance by itself
//!     async fn timed_out(&mut self, _t: PaymentTimedOut, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//!         ctx.send(&CancelOrder { id: self.order.clone() })?;
//!         ctx.complete();
//!         Ok(())
//!     }
//! }
//! # fn main() {}
//! ```
//!
//! It joins an endpoint that has a store with `.saga::<Checkout>()`, or
//! [`saga_with`](EndpointBuilder::saga_with) and [`saga::SagaOptions`].
//!
//! # 3. Testing it in virtual time
//!
//! [`testing::TestEndpoint`] runs an endpoint (the real runtime, store and broker, no mocks)
//! on an in-memory broker and a [`VirtualClock`] that moves only when the test says:
//! `send` returns once the message is handled, `advance` moves time through every due
//! timeout, and the queries say what was sent, published, scheduled and dead-lettered.
//!
//! ```
//! # use std::time::Duration;
//! # use courier::saga::SagaContext;
//! # use courier::HandlerError;
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize, courier::Message)]
//! # struct OrderPlaced { id: String }
//! # #[derive(Serialize, Deserialize, courier::Message)]
//! # struct PaymentReceived { order: String }
//! # #[derive(Serialize, Deserialize, courier::Message)]
//! # struct PaymentTimedOut;
//! # #[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
//! # struct CancelOrder { id: String }
//! # #[derive(Default, Serialize, Deserialize)]
//! # struct Checkout { order: String }
//! # #[courier::saga]
//! # impl Checkout {
//! #     #[start(by = id)]
//! #     async fn placed(&mut self, m: OrderPlaced, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//! #         self.order = m.id;
//! #         ctx.request_timeout(Duration::from_secs(30 * 60), &PaymentTimedOut)?;
//! #         Ok(())
//! #     }
//! #     #[handle(by = order)]
//! #     async fn paid(&mut self, _m: PaymentReceived, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//! #         ctx.complete();
//! #         Ok(())
//! #     }
//! #     #[timeout]
//! #     async fn timed_out(&mut self, _t: PaymentTimedOut, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//! #         ctx.send(&CancelOrder { id: self.order.clone() })?;
//! #         ctx.complete();
//! #         Ok(())
//! #     }
//! # }
//! use courier::testing::TestEndpoint;
//! use courier::Routes;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In a test file: #[tokio::test] async fn unpaid_orders_are_cancelled() { ... }
//! let routes = Routes::new().send::<CancelOrder>("orders");
//! let t = TestEndpoint::start("checkout", |e| e.routes(routes).saga::<Checkout>()).await?;
//!
//! t.send(&OrderPlaced { id: "o-1".into() }).await?;
//! t.send(&OrderPlaced { id: "o-2".into() }).await?;
//! t.send(&PaymentReceived { order: "o-1".into() }).await?;
//! t.advance(Duration::from_secs(30 * 60)).await?;     // half an hour, in milliseconds
//!
//! assert_eq!(t.sent::<CancelOrder>().await?, vec![CancelOrder { id: "o-2".into() }]);
//! assert!(t.saga::<Checkout>("o-2").await?.is_none()); // completed
//! t.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! To run the same endpoint on real servers in a test, [`test_servers`] gives each test
//! a fresh Postgres database and RabbitMQ virtual host.
//!
//! # 4. The broker underneath
//!
//! Endpoints are built on the transport contract ([`Transport`], [`Sender`],
//! [`Receiver`], [`Delivery`]: PeekLock receives, settlements that take the delivery, scheduled
//! messages, sessions), which every broker implements rule by rule. Programs rarely call it
//! directly; [`Embedded`] shows how, and `cargo run -p courier-examples --bin tour` walks
//! through it.
//!
//! # Guides
//!
//! The repository's `docs/` folder holds the guides, each with complete programs that are
//! compiled as tests of this crate:
//!
//! | page | what |
//! |---|---|
//! | `docs/endpoints.md` | message types and wire names, versions, routing, the context, retries, shutdown |
//! | `docs/sagas.md` | finding instances, correlation properties, timeouts, messages that find no instance |
//! | `docs/testing.md` | `TestEndpoint`, your own tables in tests, `test_servers` |
//! | `docs/stores.md` | the inbox and the outbox: what happens once, group commit |
//! | `docs/embedded-broker.md`, `docs/rabbitmq.md`, `docs/postgres.md` | the three transports |
//! | `docs/operations.md`, `docs/console.md`, `docs/history.md` | the runbook, the `courier` command, the web console, a workflow's history |
//! | `docs/observability.md` | metrics and traces |
//! | `docs/semantics.md` | the broker contract, rules S1-S7 |
//!
//! # Features
//!
//! | feature | what it adds |
//! |---|---|
//! | `sqlite` (default) | the [`Embedded`] broker, the SQLite store, [`testing`] |
//! | `postgres` | the Postgres store and transport, [`test_servers`] |
//! | `amqp` | the RabbitMQ transport (needs the patched crates in the repository's `patches/`: see its README) |
//! | `opentelemetry` | trace context through the application's OpenTelemetry propagator |
//! | `conformance` | the transport conformance suite, for transport implementers |

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
    #[doc = include_str!("../../docs/rabbitmq-cluster.md")]
    struct RabbitmqCluster;
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
    #[doc = include_str!("../../docs/console.md")]
    struct Console;
    #[doc = include_str!("../../docs/history.md")]
    struct History;
    #[doc = include_str!("../../docs/postgres.md")]
    struct Postgres;
    #[doc = include_str!("../../docs/postgres-reference.md")]
    struct PostgresReference;
    #[doc = include_str!("../../docs/measurements.md")]
    struct Measurements;
    #[doc = include_str!("../../docs/measurements-postgres.md")]
    struct MeasurementsPostgres;
    #[doc = include_str!("../../docs/measurements-postgres-send.md")]
    struct MeasurementsPostgresSend;
    #[doc = include_str!("../../docs/measurements-postgres-gaps.md")]
    struct MeasurementsPostgresGaps;
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
pub use endpoint::version;

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
pub use endpoint::batch::{Batch, BatchContext, BatchHandler, BatchOptions};
pub use endpoint::bus::{Bus, SendOptions};
pub use endpoint::context::Context;
pub use endpoint::handler::{BoxFuture, Declared, Handler, HandlerError, Message, ResultExt};
pub use endpoint::history::{DEFAULT_HISTORY_MAX_BYTES, DEFAULT_HISTORY_RETENTION, HistoryOptions};
pub use store::history::{
    HistoryDetail, HistoryEvent, HistoryKind, SagaChange, SentMessage, TimeoutDispatch, TimeoutMark,
};

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
pub use amqp::{
    AmqpBuilder, AmqpTransport, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OPERATION_TIMEOUT, ScheduleStore, WireStats,
};
#[cfg(feature = "sqlite")]
pub use embedded::{DEFAULT_READ_CONNECTIONS, Durability, Embedded, EmbeddedBuilder, EmbeddedStore};
#[cfg(feature = "postgres")]
pub use postgres::{
    DEFAULT_PG_NOTIFY_INTERVAL, DEFAULT_PG_POLL_INTERVAL, PgTransportBuilder, PgTransportStore, PostgresTransport,
};
#[cfg(feature = "postgres")]
pub use store::PostgresStore;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::{
    Begin, BeginBatch, CommitGroup, Committed, DEFAULT_INBOX_RETENTION, DueTimeouts, EndpointSecret, OutboxDeadLetter,
    OutboxMessage, Store, StoreBacklog, StoredSaga, TakenTimeout, Timeout, TimeoutClaim, UnitOfWork, UnitOfWorkScope,
};

/// The names most programs need: `use courier::prelude::*;`.
pub mod prelude {
    #[cfg(feature = "sqlite")]
    pub use crate::Embedded;
    pub use crate::{
        Batch, BatchContext, BatchOptions, Bus, Context, Endpoint, Handler, HandlerError, HistoryOptions, Message,
        ResultExt, RetryPolicy, Routes, SendOptions, handler,
    };
    pub use crate::{
        Clock, Codec, Delivery, EntityPath, Envelope, JsonCodec, QueueOptions, ReceivedMessage, Receiver, Sender,
        SenderOptions, SessionReceiver, SessionSelector, Settlement, SystemClock, TopicOptions, Transport,
        VirtualClock,
    };
}
