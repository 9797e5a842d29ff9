//! Forged and early timeouts (issue 31, point 4): a message of a saga's timeout type that
//! carries the headers of a real stored timeout (its id is what `courier timeouts`, the
//! console and the logs show) was handled at once, so a one-hour timeout fired an hour
//! early. Only the copy the timeout dispatcher sealed fires a timeout, and not before its
//! due time; a refused copy is dead-lettered with its reason, changes nothing and does
//! not stop the real timeout. On the three stores with the embedded broker, on the
//! Postgres transport and on RabbitMQ (with a Postgres store).

use courier::recoverability::reasons;
use courier::saga::SagaOptions;
use courier::saga::headers;
use courier::{Clock, EntityPath, Envelope, Message as _, PropertyValue, SendOptions, SenderOptions, TimeoutClaim};
use courier_tests::eventually;
use courier_tests::stores::StoreKind;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::{Bump, Env, Remind, begin, handled};

impl Env {
    /// The pending timeout as an operator (or a producer reading the logs) sees it: its
    /// id, and a copy of its message with every header the store keeps (everything but
    /// the seal, which is not stored).
    async fn visible_timeout(&self) -> (String, Envelope) {
        let table = self.env.kind.table("saga_timeout");
        let column = if self.env.kind.postgres() {
            "envelope::text"
        } else {
            "envelope"
        };
        let id = self.env.text(&format!("SELECT id FROM {table}")).await.unwrap();
        let json = self.env.text(&format!("SELECT {column} FROM {table}")).await.unwrap();
        let stored: serde_json::Value = serde_json::from_str(&json).unwrap();
        let properties: std::collections::BTreeMap<String, PropertyValue> =
            serde_json::from_value(stored["properties"].clone()).unwrap();
        assert!(
            !properties.contains_key(headers::TIMEOUT_SEAL),
            "the seal is never stored with the row"
        );
        let mut copy = Remind.to_envelope().unwrap().with_message_id(id.clone());
        copy.properties = properties;
        (id, copy)
    }

    /// Sends `envelope` to the endpoint's queue as any producer can.
    async fn send_raw(&self, envelope: Envelope) -> courier::Result<()> {
        self.send_raw_to("flows", envelope).await
    }

    /// Sends `envelope` to `queue` as any producer can.
    async fn send_raw_to(&self, queue: &str, envelope: Envelope) -> courier::Result<()> {
        let sender = self.env.fx.transport.sender(queue, SenderOptions::default()).await?;
        sender.send(envelope).await.map_err(courier::Error::from)
    }

    /// The dead letters of the endpoint's queue: (reason, description).
    async fn dead(&self) -> Vec<(String, String)> {
        self.dead_of("flows").await
    }

    /// The dead letters of `queue`: (reason, description). Peeked; drained on RabbitMQ,
    /// which cannot browse.
    async fn dead_of(&self, queue: &str) -> Vec<(String, String)> {
        let transport = &self.env.fx.transport;
        let path = EntityPath::queue(queue).dead_letter();
        let messages = if transport.name() == "amqp" {
            let dlq = transport.receiver(&path).await.unwrap();
            let mut dead = Vec::new();
            loop {
                let got = dlq.receive(16, std::time::Duration::from_millis(500)).await.unwrap();
                if got.is_empty() {
                    break dead;
                }
                for d in got {
                    dead.push(d.message().clone());
                    d.complete().await.unwrap();
                }
            }
        } else {
            transport.peek(&path, 0, 500).await.unwrap()
        };
        messages
            .into_iter()
            .map(|m| {
                (
                    m.broker.dead_letter_reason.unwrap_or_default(),
                    m.broker.dead_letter_description.unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Whether the timeout `id` is still pending and not marked dead-lettered.
    async fn still_pending(&self, id: &str) -> bool {
        let table = self.env.kind.table("saga_timeout");
        self.env
            .count(&format!(
                "SELECT COUNT(*) FROM {table} WHERE id = '{id}' AND dead_lettered_at IS NULL"
            ))
            .await
            == 1
    }

    /// The saga instance's row version (1: never changed since it started).
    async fn version(&self, correlation: &str) -> i64 {
        let table = self.env.kind.table("saga");
        self.env
            .count(&format!(
                "SELECT version FROM {table} WHERE correlation = '{correlation}'"
            ))
            .await
    }

    /// Lets the real timeout come due (an hour after `begin`) and checks it fires then,
    /// once: not a second before. `completed` is what the endpoint completed so far.
    async fn real_timeout_fires_at_its_due_time(&self, flows: &courier::RunningEndpoint, id: &str, completed: u64) {
        self.advance(3599);
        handled_at(flows, &Bump { id: id.into() }, completed + 1).await;
        assert_eq!(self.fired(), 0, "not before its due time");
        self.advance(2);
        eventually("the real timeout", || async { self.fired() == 1 }).await;
        eventually("its handling committed", || async {
            self.rows("saga_timeout").await == 0
        })
        .await;
        assert_eq!(self.fired(), 1, "once");
        assert!(
            !self.probe.saw_seal.load(std::sync::atomic::Ordering::SeqCst),
            "the handler does not see the seal"
        );
    }
}

/// Sends `message` to the endpoint `flows` (whatever its name) and waits until it
/// completed `n` messages in all.
async fn handled_at<M: courier::Message>(flows: &courier::RunningEndpoint, message: &M, n: u64) {
    flows
        .bus()
        .send_with(message, SendOptions::new().to(flows.name()))
        .await
        .unwrap();
    eventually("the message handled", || async { flows.stats().completed >= n }).await;
}

/// A copy of a real timeout's message with every header the store keeps (the id from
/// `courier timeouts`), sent an hour early, is dead-lettered as forged, without changing
/// the saga or the timeout; the real timeout fires at its due time. (It was handled at
/// once: the timeout fired an hour early.)
async fn a_forged_copy_is_dead_lettered_and_the_real_timeout_fires_on_time(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("forged-1", Some(3600)), 1).await;
    let (id, forged) = env.visible_timeout().await;
    assert_eq!(
        forged.properties.get(headers::TIMEOUT_ID),
        Some(&PropertyValue::String(id.clone()))
    );
    env.send_raw(forged).await.unwrap();
    eventually("the forged copy dead-lettered", || async {
        flows.stats().dead_lettered == 1
    })
    .await;
    let dead = env.dead().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, reasons::FORGED_TIMEOUT, "{dead:?}");
    assert!(
        dead[0].1.contains(&id) && dead[0].1.contains("forged") && dead[0].1.contains(headers::TIMEOUT_SEAL),
        "the description names the timeout and why: {}",
        dead[0].1
    );
    assert_eq!(env.fired(), 0, "the saga did not handle the forged copy");
    assert_eq!(env.probe.attempts.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(env.version("forged-1").await, 1, "the saga is unchanged");
    assert!(env.still_pending(&id).await, "the real timeout is untouched");
    assert_eq!(flows.stats().timeouts_dead_lettered, 0);
    assert_eq!(flows.stats().completed, 1);
    env.real_timeout_fires_at_its_due_time(&flows, "forged-1", 1).await;
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Regression: the same copy under a type no handler knows is dead-lettered as an unknown
/// type, and that dead-lettering marked the row its headers name dead-lettered: the real
/// timeout was never sent again. A row is now marked only by a copy the dispatcher
/// sealed.
async fn a_dead_lettered_copy_of_another_type_does_not_stop_the_timeout(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("forged-2", Some(3600)), 1).await;
    let (id, mut other_type) = env.visible_timeout().await;
    other_type.message_type = Some("tests.NoSuchType".into());
    env.send_raw(other_type).await.unwrap();
    eventually("the copy dead-lettered", || async { flows.stats().dead_lettered == 1 }).await;
    let dead = env.dead().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, reasons::UNKNOWN_MESSAGE_TYPE);
    assert!(env.still_pending(&id).await, "the real timeout's row is not marked");
    assert_eq!(flows.stats().timeouts_dead_lettered, 0);
    env.real_timeout_fires_at_its_due_time(&flows, "forged-2", 1).await;
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// The dispatcher's own sealed copy, sent again before its due time, is refused as early:
/// dead-lettered with `courier.EarlyTimeout`, the saga and the timeout's row unchanged;
/// the copy scheduled for the due time fires then.
async fn an_early_copy_of_the_dispatchers_message_is_refused(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("early-1", Some(3600)), 1).await;
    let (id, _) = env.visible_timeout().await;
    // A claim that reaches an hour ahead takes the timeout now, as the dispatcher does a
    // second before it is due: its copy is sealed and scheduled for the due time.
    let now = Clock::now(&env.env.fx.clock);
    let mut claimed = env
        .env
        .store
        .claim_due_timeouts(
            "flows",
            TimeoutClaim {
                now,
                marked_at: now,
                due_until: now + chrono::Duration::hours(2),
                reclaim_before: now - chrono::Duration::minutes(5),
                limit: 10,
                max_dispatches: courier::DEFAULT_MAX_TIMEOUT_DISPATCHES,
                enqueue: kind.one_transaction(),
                history: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(claimed.claimed, 1);
    let scheduled = match claimed.to_send.pop() {
        Some(copy) => {
            env.send_raw(copy.clone()).await.unwrap();
            copy
        }
        // Enqueued in the claiming transaction: the scheduled copy is in the queue.
        None => {
            let queued = env
                .env
                .fx
                .transport
                .peek(&EntityPath::queue("flows"), 0, 10)
                .await
                .unwrap();
            assert_eq!(queued.len(), 1);
            queued[0].envelope.clone()
        }
    };
    assert!(scheduled.scheduled_enqueue_time.is_some(), "{scheduled:?}");
    assert!(matches!(
        scheduled.properties.get(headers::TIMEOUT_SEAL),
        Some(PropertyValue::String(s)) if s.len() == 64
    ));
    let mut early = scheduled;
    early.scheduled_enqueue_time = None;
    env.send_raw(early).await.unwrap();
    eventually("the early copy dead-lettered", || async {
        flows.stats().dead_lettered == 1
    })
    .await;
    let dead = env.dead().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0, reasons::EARLY_TIMEOUT, "{dead:?}");
    assert!(dead[0].1.contains("before its due time"), "{}", dead[0].1);
    assert_eq!(env.fired(), 0);
    assert_eq!(env.version("early-1").await, 1, "the saga is unchanged");
    assert!(env.still_pending(&id).await, "the timeout's row is not marked");
    // The scheduled copy fires at the due time.
    env.advance(3599);
    handled(&flows, &Bump { id: "early-1".into() }, 2).await;
    assert_eq!(env.fired(), 0, "not before its due time");
    env.advance(2);
    eventually("the real timeout", || async { env.fired() == 1 }).await;
    eventually("its handling committed", || async {
        env.rows("saga_timeout").await == 0
    })
    .await;
    assert_eq!(env.fired(), 1);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Any value a producer can send for a header: text (no NUL: the Postgres transport's
/// JSON refuses it, before any endpoint sees it), integers, booleans, finite floats.
fn sendable_value() -> impl Strategy<Value = PropertyValue> {
    prop_oneof![
        "[^\u{0}]{0,40}".prop_map(PropertyValue::String),
        "[0-9a-f]{64}".prop_map(PropertyValue::String),
        "20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?Z"
            .prop_map(PropertyValue::String),
        any::<i64>().prop_map(PropertyValue::Int),
        any::<bool>().prop_map(PropertyValue::Bool),
        (-1e15f64..1e15).prop_map(PropertyValue::Float),
    ]
}

/// A forged copy of the real timeout `real`: each timeout header (and the seal) kept as
/// the store has it, dropped, or any value; the message id the timeout's or another; the
/// body the real one or any bytes.
fn forged_copy(real: Envelope) -> impl Strategy<Value = Envelope> {
    let names = [
        headers::TIMEOUT_ID,
        headers::SAGA_TYPE,
        headers::CORRELATION,
        headers::TIMEOUT_KEY,
        headers::TIMEOUT_DUE,
        headers::TIMEOUT_SEAL,
    ];
    let header = |name: &'static str, real: &Envelope| {
        let kept = real.properties.get(name).cloned();
        prop_oneof![
            3 => Just(kept),
            1 => Just(None),
            3 => sendable_value().prop_map(Some),
        ]
        .prop_map(move |v| (name, v))
    };
    let headers: Vec<_> = names.iter().map(|n| header(n, &real)).collect();
    let id = real.message_id.clone();
    (
        headers,
        prop_oneof![Just(id), "[a-zA-Z0-9_:-]{1,64}"],
        prop_oneof![Just(real.body.to_vec()), proptest::collection::vec(any::<u8>(), 0..48)],
    )
        .prop_map(move |(headers, message_id, body)| {
            let mut copy = real.clone().with_message_id(message_id);
            copy.body = body.into();
            for (name, value) in headers {
                match value {
                    Some(v) => drop(copy.properties.insert(name.into(), v)),
                    None => drop(copy.properties.remove(name)),
                }
            }
            copy
        })
}

/// How many forged copies one run sends.
const FORGED_CASES: usize = 48;

/// Property, end to end: forged copies of a real timeout's message, with any values for
/// its timeout headers, its seal, its id and its body, never fire the timeout: each is
/// dead-lettered as forged (none handled, none dropped, none left in the queue), the saga
/// is unchanged, and the real timeout still fires at its due time.
async fn forged_header_values_never_fire_the_timeout(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("prop-1", Some(3600)), 1).await;
    let (id, real) = env.visible_timeout().await;
    let strategy = forged_copy(real);
    let mut runner = TestRunner::deterministic();
    let mut sent = Vec::new();
    for _ in 0..FORGED_CASES {
        let copy = strategy.new_tree(&mut runner).unwrap().current();
        sent.push(format!("{copy:?}"));
        env.send_raw(copy).await.unwrap();
    }
    eventually("every forged copy dead-lettered", || async {
        flows.stats().dead_lettered == FORGED_CASES as u64
    })
    .await;
    let dead = env.dead().await;
    assert_eq!(dead.len(), FORGED_CASES);
    for (reason, description) in &dead {
        assert_eq!(reason, reasons::FORGED_TIMEOUT, "{description}\nsent: {sent:#?}");
    }
    assert_eq!(env.fired(), 0, "sent: {sent:#?}");
    assert_eq!(env.probe.attempts.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(env.version("prop-1").await, 1);
    assert!(env.still_pending(&id).await);
    assert_eq!(flows.stats().completed, 1, "none handled, none dropped as a duplicate");
    env.real_timeout_fires_at_its_due_time(&flows, "prop-1", 1).await;
    flows.shutdown().await.unwrap();
    env.finish().await;
}

on_every_store!(
    a_forged_copy_is_dead_lettered_and_the_real_timeout_fires_on_time,
    a_dead_lettered_copy_of_another_type_does_not_stop_the_timeout,
    an_early_copy_of_the_dispatchers_message_is_refused,
    forged_header_values_never_fire_the_timeout,
);

/// On RabbitMQ (a Postgres store; timeouts handed back by the claim and sent as scheduled
/// messages through the transport's scheduler): a copy with every header the row keeps,
/// the same copy under another type, and forged copies with any header values are
/// dead-lettered (as forged, or as an unknown type) without touching the saga or the
/// timeout, and the real timeout, sealed by the claim, fires at its due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_forged_copies_are_dead_lettered_and_the_real_timeout_fires_on_time() {
    let mut env = Env::new(StoreKind::Postgres).await;
    env.env.fx = courier_tests::rabbit::amqp_fixture().await;
    let name = format!("forged-{}", uuid::Uuid::new_v4().simple());
    let flows = env.builder_named(&name, SagaOptions::default()).start().await.unwrap();
    handled_at(&flows, &begin("rabbit-1", Some(3600)), 1).await;
    let (id, forged) = env.visible_timeout().await;
    let mut other_type = forged.clone();
    other_type.message_type = Some("tests.NoSuchType".into());
    let strategy = forged_copy(forged.clone());
    let mut runner = TestRunner::deterministic();
    let mut copies = vec![forged, other_type];
    copies.extend((0..16).map(|_| strategy.new_tree(&mut runner).unwrap().current()));
    let n = copies.len() as u64;
    for copy in copies {
        env.send_raw_to(&name, copy).await.unwrap();
    }
    eventually("every copy dead-lettered", || async {
        flows.stats().dead_lettered == n
    })
    .await;
    let dead = env.dead_of(&name).await;
    assert_eq!(dead.len() as u64, n);
    let unknown = dead.iter().filter(|(r, _)| r == reasons::UNKNOWN_MESSAGE_TYPE).count();
    assert_eq!(unknown, 1, "{dead:?}");
    assert!(
        dead.iter()
            .all(|(r, _)| r == reasons::FORGED_TIMEOUT || r == reasons::UNKNOWN_MESSAGE_TYPE),
        "{dead:?}"
    );
    assert_eq!(env.fired(), 0);
    assert_eq!(env.version("rabbit-1").await, 1, "the saga is unchanged");
    assert!(env.still_pending(&id).await, "the real timeout is untouched");
    assert_eq!(flows.stats().completed, 1);
    env.real_timeout_fires_at_its_due_time(&flows, "rabbit-1", 1).await;
    flows.shutdown().await.unwrap();
    env.finish().await;
}
