//! Producer-written failure headers are not the failure (issue 31, point 6): whatever
//! headers in Courier's namespaces (`courier.failure.*`, `courier.*`) a producer puts on
//! a message, the operations API (`QueueAdmin`) never shows one of their values as the
//! failure (`error`, `error_chain`) of its dead letter, and where Courier dead-letters the
//! message itself (an unknown type, a body that does not decode, a handler's permanent
//! failure) no `courier.failure.*` header of the producer's is left on it: Courier's own
//! record replaces them. A message the transport dead-letters itself (an expired one)
//! keeps the producer's headers as headers, but they are not shown as its failure.
//!
//! A property over the producer's headers, on the embedded broker, the Postgres transport
//! and RabbitMQ (through `AmqpAdmin`). Each test uses queues of its own.

use std::sync::Arc;
use std::time::Duration;

use courier::admin::{AmqpAdmin, EmbeddedAdmin, PostgresAdmin, QueueAdmin};
use courier::recoverability::headers;
use courier::{
    Clock, Context, Embedded, Endpoint, EntityPath, Envelope, Message, PropertyValue, QueueOptions, ResultExt,
    RetryPolicy, Routes, RunningEndpoint, ScheduleStore, SenderOptions, Transport, VirtualClock,
};
use courier_tests::{eventually, rabbit};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde::{Deserialize, Serialize};

use crate::support::handler_fn;

/// What every forged text value starts with: no text Courier writes holds it.
const MARK: &str = "FORGED";

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "forge.Charge")]
struct Charge {
    n: u32,
}

/// How the message ends in the dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// No handler knows its type: the endpoint dead-letters it.
    UnknownType,
    /// Its body is not a `Charge`: the endpoint dead-letters it.
    Malformed,
    /// The handler fails for good: the endpoint dead-letters it.
    Permanent,
    /// Its time-to-live runs out in a queue no endpoint reads: the transport
    /// dead-letters it.
    Expired,
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(headers::FAILURE_HEADERS.to_vec()).prop_map(str::to_owned),
        "[a-z_.]{1,12}".prop_map(|s| format!("courier.failure.{s}")),
        "[a-z_.]{1,12}".prop_map(|s| format!("courier.{s}")),
    ]
}

fn header_value() -> impl Strategy<Value = PropertyValue> {
    prop_oneof![
        4 => "[ -~]{0,24}".prop_map(|s| PropertyValue::String(format!("{MARK}{s}"))),
        1 => "[ -~]{0,24}".prop_map(|s| PropertyValue::String(format!("{MARK}\n{s}\n{MARK}"))),
        1 => any::<i64>().prop_map(PropertyValue::Int),
        1 => any::<bool>().prop_map(PropertyValue::Bool),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    prop::sample::select(vec![Case::UnknownType, Case::Malformed, Case::Permanent, Case::Expired])
}

type Input = Vec<(Case, Vec<(String, PropertyValue)>)>;

fn input() -> impl Strategy<Value = Input> {
    prop::collection::vec(
        (case(), prop::collection::vec((header_name(), header_value()), 1..6)),
        1..5,
    )
}

/// One transport under test: its queues, endpoint, clock and admin.
struct Setup {
    transport: Arc<dyn Transport>,
    admin: Box<dyn QueueAdmin>,
    clock: VirtualClock,
    /// The endpoint's queue and the queue no endpoint reads.
    queue: String,
    idle: String,
    running: Option<RunningEndpoint>,
}

async fn start(transport: Arc<dyn Transport>, admin: Box<dyn QueueAdmin>, clock: VirtualClock, tag: &str) -> Setup {
    let queue = format!("forge-{tag}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let idle = format!("{queue}-idle");
    transport.create_queue(&idle, &QueueOptions::default()).await.unwrap();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let running = Endpoint::builder(&queue)
        .transport(transport.clone())
        .clock(shared)
        .routes(Routes::new().send::<Charge>(&queue))
        .recoverability(RetryPolicy::none())
        .handler(handler_fn("forge", |_m: Charge, _ctx: &mut Context| {
            Box::pin(async {
                Err::<(), _>(std::io::Error::other("card declined")).permanent()?;
                Ok(())
            })
        }))
        .start()
        .await
        .unwrap();
    Setup {
        transport,
        admin,
        clock,
        queue,
        idle,
        running: Some(running),
    }
}

impl Setup {
    async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await.unwrap();
        }
        for q in [&self.queue, &self.idle] {
            let _ = self.transport.delete(&EntityPath::queue(q.as_str())).await;
        }
    }

    /// Sends the messages of `input` (ids `<n>-<i>`) and checks what the admin shows.
    async fn check(&self, n: u64, input: &Input) -> Result<(), TestCaseError> {
        let mut expected = Vec::new();
        for (i, (case, forged)) in input.iter().enumerate() {
            let id = format!("m{n}-{i}");
            let mut m = match case {
                Case::UnknownType => Envelope::json(&serde_json::json!({"n": 1}))
                    .unwrap()
                    .with_message_type("forge.Nobody"),
                Case::Malformed => Envelope::new("not json").with_message_type(Charge::NAME),
                Case::Permanent | Case::Expired => Charge { n: 1 }.to_envelope().unwrap(),
            };
            m.message_id = id.clone();
            for (k, v) in forged {
                m.properties.insert(k.clone(), v.clone());
            }
            let to = if *case == Case::Expired {
                m = m.with_time_to_live(Duration::from_secs(1));
                &self.idle
            } else {
                &self.queue
            };
            let sender = self.transport.sender(to, SenderOptions::default()).await.unwrap();
            sender.send(m).await.unwrap();
            expected.push((id, *case, to.clone()));
        }
        if expected.iter().any(|(_, c, _)| *c == Case::Expired) {
            self.clock.advance(Duration::from_secs(2));
            // A receive of the idle queue moves the expired messages (every transport
            // dead-letters what it finds expired by then).
            let r = self
                .transport
                .receiver(&EntityPath::queue(self.idle.as_str()))
                .await
                .unwrap();
            let got = r.receive(10, Duration::from_millis(100)).await.unwrap();
            prop_assert!(got.is_empty(), "an expired message was handed out");
        }
        for (id, case, queue) in &expected {
            let find = || async {
                let all = self.admin.dead_letters(queue, 0, 1000).await.unwrap();
                all.items.into_iter().find(|d| &d.message_id == id)
            };
            eventually(&format!("{id} in the dead letters of {queue}"), || async {
                find().await.is_some()
            })
            .await;
            let listed = find().await.unwrap();
            let shown = self.admin.dead_letter(queue, listed.sequence_number).await.unwrap();
            for (what, text) in [
                ("listed error", &listed.error),
                ("error", &shown.error),
                ("error chain", &shown.error_chain),
            ] {
                prop_assert!(
                    !text.as_deref().unwrap_or_default().contains(MARK),
                    "{case:?} {id}: the {what} is the producer's: {text:?}"
                );
            }
            if *case != Case::Expired {
                for (k, v) in &shown.headers {
                    if k.starts_with(headers::FAILURE_PREFIX) {
                        prop_assert!(
                            !matches!(v, PropertyValue::String(s) if s.contains(MARK)),
                            "{case:?} {id}: the producer's {k} = {v:?} stayed beside Courier's failure"
                        );
                    }
                }
                let endpoint = shown.headers.get(headers::FAILURE_ENDPOINT);
                prop_assert_eq!(endpoint, Some(&PropertyValue::String(self.queue.clone())));
            }
            match case {
                Case::Permanent => {
                    prop_assert_eq!(listed.error.as_deref(), Some("card declined"));
                    prop_assert_eq!(
                        shown.headers.get(headers::FAILURE_HANDLER),
                        Some(&PropertyValue::String("forge".into()))
                    );
                }
                Case::UnknownType => {
                    let e = listed.error.clone().unwrap_or_default();
                    prop_assert!(e.contains("has no handler for message type"), "{e}");
                }
                Case::Malformed => {
                    prop_assert!(listed.error.is_some());
                    // A body that does not decode fails before any handler runs.
                    prop_assert_eq!(shown.headers.get(headers::FAILURE_HANDLER), None);
                }
                Case::Expired => {
                    prop_assert_eq!(shown.reason.as_deref(), Some(courier::reasons::TTL_EXPIRED));
                }
            }
        }
        Ok(())
    }
}

/// Runs the property on `setup`: `cases` cases, each a few messages.
fn property(rt: &tokio::runtime::Runtime, setup: &Setup, cases: u32) {
    courier_tests::run_property(
        rt,
        cases,
        &input(),
        |n, input| async move { setup.check(n, &input).await },
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn embedded_a_producers_failure_headers_are_never_shown_as_the_failure() {
    let rt = runtime();
    let setup = rt.block_on(async {
        let clock = VirtualClock::starting_now();
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let broker = Embedded::builder().in_memory().clock(shared).open().await.unwrap();
        let admin = EmbeddedAdmin::new(broker.clone());
        start(Arc::new(broker), Box::new(admin), clock, "emb").await
    });
    property(&rt, &setup, 24);
    rt.block_on(setup.stop());
}

#[test]
fn pg_a_producers_failure_headers_are_never_shown_as_the_failure() {
    let rt = runtime();
    let setup = rt.block_on(async {
        let clock = VirtualClock::starting_now();
        let t = courier_tests::pg_transport::transport(&clock).await;
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let admin = PostgresAdmin::new(t.pool().clone()).clock(shared);
        start(Arc::new(t), Box::new(admin), clock, "pg").await
    });
    property(&rt, &setup, 16);
    rt.block_on(setup.stop());
}

#[test]
fn amqp_a_producers_failure_headers_are_never_shown_as_the_failure() {
    let rt = runtime();
    let setup = rt.block_on(async {
        let clock = VirtualClock::starting_now();
        let store = rabbit::memory_store().await;
        let t = rabbit::transport(&clock, ScheduleStore::from(&store)).await;
        let admin = AmqpAdmin::new(&t);
        start(Arc::new(t), Box::new(admin), clock, "amqp").await
    });
    property(&rt, &setup, 8);
    rt.block_on(setup.stop());
}
