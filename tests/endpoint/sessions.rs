//! Endpoints on a session queue (issue 35; docs/endpoints.md, "Sessions"), on the
//! embedded broker, the Postgres transport and RabbitMQ: an endpoint of concurrency 4
//! handles different sessions at once and each session's messages in send order, one at
//! a time, also as two instances on two transports (two processes) sharing a store,
//! nothing handled twice; an immediate retry keeps the order; what the endpoint refuses
//! at start on a session queue (delayed retries, group commit, a declaration that
//! disagrees with the queue); a message without a session id never blocks the queue.
//!
//! The handler records, for each call, its session, its number in the session and a
//! start and an end tick of one counter shared by every handler: "no overlap" is each
//! call of a session starting after the previous one's end, by that counter, not by a
//! clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::{
    Clock, Context, Embedded, Endpoint, EntityPath, ErrorKind, HandlerError, Message, QueueOptions, RetryPolicy,
    Routes, RunningEndpoint, SendOptions, Store, Transport, VirtualClock,
};
use courier_tests::eventually;
use serde::{Deserialize, Serialize};

use crate::support::{FnHandler, handler_fn};

/// One message of a session: its session and its number in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "test.SessionStep")]
pub struct Step {
    pub session: String,
    pub seq: u32,
}

const SESSIONS: u32 = 20;
const PER_SESSION: u32 = 10;

/// One call of the handler.
#[derive(Debug, Clone)]
struct Call {
    session: String,
    seq: u32,
    start: u64,
    end: u64,
    ok: bool,
    instance: &'static str,
}

/// The calls of every instance, and the counter their ticks come from.
#[derive(Clone, Default)]
struct Record {
    calls: Arc<Mutex<Vec<Call>>>,
    ticks: Arc<AtomicU64>,
}

impl Record {
    fn all(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    fn succeeded(&self) -> usize {
        self.all().iter().filter(|c| c.ok).count()
    }
}

/// A handler that records its call; it fails the first attempt of the messages `fails`
/// picks. It yields for a moment in the middle, so that calls can overlap.
fn step_handler(record: &Record, instance: &'static str, fails: fn(&Step) -> bool) -> FnHandler<Step> {
    let record = record.clone();
    handler_fn("step", move |m: Step, ctx: &mut Context| {
        let record = record.clone();
        let fail = fails(&m) && ctx.attempt() == 1;
        Box::pin(async move {
            let start = record.ticks.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(2)).await;
            let end = record.ticks.fetch_add(1, Ordering::SeqCst);
            record.calls.lock().unwrap().push(Call {
                session: m.session,
                seq: m.seq,
                start,
                end,
                ok: !fail,
                instance,
            });
            if fail {
                return Err(HandlerError::msg("the first attempt fails"));
            }
            Ok(())
        })
    })
}

fn never(_: &Step) -> bool {
    false
}

/// The third message of every other session fails once.
fn third_of_even_sessions(m: &Step) -> bool {
    m.seq == 3 && m.session.ends_with(['0', '2', '4', '6', '8'])
}

fn session_options() -> QueueOptions {
    QueueOptions::default().requires_session(true)
}

/// The retry policy a session endpoint takes: immediate retries only.
fn in_place() -> RetryPolicy {
    RetryPolicy::default().immediate(3).delayed([])
}

/// An endpoint of concurrency 4 on a session queue `name`, with `store`.
async fn session_endpoint(
    transport: Arc<dyn Transport>,
    store: Arc<dyn Store>,
    name: &str,
    handler: FnHandler<Step>,
) -> RunningEndpoint {
    session_builder(transport, name, handler)
        .store(store)
        .start()
        .await
        .unwrap()
}

/// The endpoint of `session_endpoint`, without a store yet.
fn session_builder(transport: Arc<dyn Transport>, name: &str, handler: FnHandler<Step>) -> courier::EndpointBuilder {
    Endpoint::builder(name)
        .transport(transport)
        .routes(Routes::new().send::<Step>(name))
        .queue_options(session_options())
        .recoverability(in_place())
        .concurrency(4)
        .receive_wait(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(10))
        .handler(handler)
}

fn session_name(s: u32) -> String {
    format!("customer-{s:02}")
}

/// Sends `SESSIONS` x `PER_SESSION` messages, interleaved: the first of every session,
/// then the second of every session, and so on (each round's sends at once).
async fn send_interleaved(endpoint: &RunningEndpoint) {
    for seq in 0..PER_SESSION {
        let mut sends = tokio::task::JoinSet::new();
        for s in 0..SESSIONS {
            let session = session_name(s);
            let options = SendOptions::new().session_id(session.clone());
            let bus = endpoint.bus().clone();
            sends.spawn(async move { bus.send_with(&Step { session, seq }, options).await.unwrap() });
        }
        while let Some(sent) = sends.join_next().await {
            sent.unwrap();
        }
    }
}

/// Per session: the calls in start order are its messages in send order (a failed call
/// followed by its retry), each starting after the previous one ended; every message
/// succeeded exactly once. Returns whether calls of different sessions overlapped.
fn check_order(record: &Record, fails: fn(&Step) -> bool) -> bool {
    let calls = record.all();
    for s in 0..SESSIONS {
        let session = session_name(s);
        let mut mine: Vec<&Call> = calls.iter().filter(|c| c.session == session).collect();
        mine.sort_by_key(|c| c.start);
        let seqs: Vec<(u32, bool)> = mine.iter().map(|c| (c.seq, c.ok)).collect();
        let mut expected = Vec::new();
        for seq in 0..PER_SESSION {
            if fails(&Step {
                session: session.clone(),
                seq,
            }) {
                expected.push((seq, false));
            }
            expected.push((seq, true));
        }
        assert_eq!(seqs, expected, "session {session}: its calls in start order");
        for pair in mine.windows(2) {
            assert!(
                pair[1].start > pair[0].end,
                "session {session}: message {} started before message {} ended: {pair:?}",
                pair[1].seq,
                pair[0].seq
            );
        }
    }
    calls.iter().any(|a| {
        calls
            .iter()
            .any(|b| a.session != b.session && a.start < b.end && b.start < a.end)
    })
}

async fn wait_all(record: &Record) {
    let want = (SESSIONS * PER_SESSION) as usize;
    eventually("every message handled", || async { record.succeeded() >= want }).await;
}

async fn embedded(clock: &VirtualClock) -> Embedded {
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    Embedded::builder().in_memory().clock(shared).open().await.unwrap()
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

// ---- the embedded broker ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_sessions_are_handled_in_order_one_at_a_time_and_in_parallel() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let record = Record::default();
    let handler = step_handler(&record, "a", never);
    // Without a store: with the broker's own store a handling holds the broker's single
    // writer from its inbox record to its commit, so no two handlings overlap at all.
    let e = session_builder(Arc::new(broker.clone()), "orders", handler)
        .start()
        .await
        .unwrap();
    send_interleaved(&e).await;
    wait_all(&record).await;
    assert!(check_order(&record, never), "sessions were handled at once");
    assert_eq!(record.all().len(), (SESSIONS * PER_SESSION) as usize);
    let report = e.shutdown().await.unwrap();
    assert_eq!(report.completed, u64::from(SESSIONS * PER_SESSION));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_two_instances_share_the_sessions_and_handle_nothing_twice() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let record = Record::default();
    let a = session_endpoint(
        Arc::new(broker.clone()),
        Arc::new(broker.store()),
        "orders",
        step_handler(&record, "a", never),
    )
    .await;
    let b = session_endpoint(
        Arc::new(broker.clone()),
        Arc::new(broker.store()),
        "orders",
        step_handler(&record, "b", never),
    )
    .await;
    send_interleaved(&a).await;
    wait_all(&record).await;
    // No overlap expected: the broker's store serializes handlings (above).
    check_order(&record, never);
    assert_eq!(record.all().len(), (SESSIONS * PER_SESSION) as usize, "nothing twice");
    let instances: std::collections::HashSet<_> = record.all().iter().map(|c| c.instance).collect();
    assert_eq!(instances.len(), 2, "both instances took sessions");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_an_immediate_retry_keeps_the_order_of_its_session() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let record = Record::default();
    let handler = step_handler(&record, "a", third_of_even_sessions);
    let e = session_endpoint(Arc::new(broker.clone()), Arc::new(broker.store()), "orders", handler).await;
    send_interleaved(&e).await;
    wait_all(&record).await;
    check_order(&record, third_of_even_sessions);
    let report = e.shutdown().await.unwrap();
    assert_eq!(report.retried, u64::from(SESSIONS / 2));
    assert_eq!(report.dead_lettered, 0);
}

/// What an endpoint refuses at start on a session queue, each with a reason that says
/// what to do; and a message without a session id is refused at send.
#[tokio::test]
async fn embedded_refusals_at_start_and_at_send() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let record = Record::default();
    let transport: Arc<dyn Transport> = Arc::new(broker.clone());
    let base = |name: &str| {
        Endpoint::builder(name)
            .transport(transport.clone())
            .store(broker.store())
            .routes(Routes::new().send::<Step>(name))
            .handler(step_handler(&record, "a", never))
    };
    let delayed = base("orders")
        .queue_options(session_options())
        .start()
        .await
        .unwrap_err();
    assert!(matches!(delayed.kind(), ErrorKind::InvalidOptions { .. }), "{delayed}");
    assert!(delayed.to_string().contains("delayed retries"), "{delayed}");
    assert!(
        delayed.to_string().contains("RetryPolicy::default().delayed([])"),
        "{delayed}"
    );
    let grouped = base("orders")
        .queue_options(session_options())
        .recoverability(in_place())
        .group_commit(4)
        .start()
        .await
        .unwrap_err();
    assert!(grouped.to_string().contains("group_commit(4)"), "{grouped}");
    // The queue exists with sessions now: an endpoint that does not say so is refused.
    let undeclared = base("orders").recoverability(in_place()).start().await.unwrap_err();
    assert!(undeclared.to_string().contains("requires sessions"), "{undeclared}");
    assert!(
        undeclared.to_string().contains("requires_session(true)"),
        "{undeclared}"
    );
    // And the other way round.
    transport.create_queue("plain", &QueueOptions::default()).await.unwrap();
    let declared = base("plain")
        .queue_options(session_options())
        .recoverability(in_place())
        .start()
        .await
        .unwrap_err();
    assert!(declared.to_string().contains("exists without sessions"), "{declared}");

    let e = session_endpoint(
        transport.clone(),
        Arc::new(broker.store()),
        "orders",
        step_handler(&record, "a", never),
    )
    .await;
    let refused = e
        .bus()
        .send(&Step {
            session: "none".into(),
            seq: 0,
        })
        .await
        .unwrap_err();
    assert!(!refused.is_transient(), "{refused}");
    assert!(refused.to_string().contains("session"), "{refused}");
    e.bus()
        .send_with(
            &Step {
                session: "s".into(),
                seq: 0,
            },
            SendOptions::new().session_id("s"),
        )
        .await
        .unwrap();
    eventually("the message with a session", || async { record.succeeded() == 1 }).await;
    e.shutdown().await.unwrap();
}

// ---- the Postgres transport ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_instances_handle_sessions_in_order_in_parallel_nothing_twice() {
    let clock = VirtualClock::starting_now();
    let one = Arc::new(courier_tests::pg_transport::transport(&clock).await);
    let two = Arc::new(courier_tests::pg_transport::transport(&clock).await);
    let name = unique("orders");
    let record = Record::default();
    let a = session_endpoint(
        one.clone(),
        Arc::new(one.store()),
        &name,
        step_handler(&record, "a", never),
    )
    .await;
    let b = session_endpoint(
        two.clone(),
        Arc::new(two.store()),
        &name,
        step_handler(&record, "b", never),
    )
    .await;
    send_interleaved(&a).await;
    wait_all(&record).await;
    assert!(check_order(&record, never), "sessions were handled at once");
    assert_eq!(record.all().len(), (SESSIONS * PER_SESSION) as usize, "nothing twice");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    let refused = one
        .sender(&name, courier::SenderOptions::default())
        .await
        .unwrap()
        .send(courier::Envelope::new("no session"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("session"), "{refused}");
    one.delete(&EntityPath::queue(&name)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_immediate_retry_keeps_the_order_of_its_session() {
    let clock = VirtualClock::starting_now();
    let one = Arc::new(courier_tests::pg_transport::transport(&clock).await);
    let name = unique("orders");
    let record = Record::default();
    let handler = step_handler(&record, "a", third_of_even_sessions);
    let e = session_endpoint(one.clone(), Arc::new(one.store()), &name, handler).await;
    send_interleaved(&e).await;
    wait_all(&record).await;
    check_order(&record, third_of_even_sessions);
    let report = e.shutdown().await.unwrap();
    assert_eq!(report.retried, u64::from(SESSIONS / 2));
    one.delete(&EntityPath::queue(&name)).await.unwrap();
}

// ---- RabbitMQ ----

/// Two RabbitMQ transports (two processes) and a Postgres store they share.
async fn rabbit_pair() -> (
    Arc<courier::AmqpTransport>,
    Arc<courier::AmqpTransport>,
    Arc<dyn Store>,
    courier_tests::pg::TestDatabase,
) {
    let url = courier_tests::rabbit::amqp_url().await;
    let one = Arc::new(courier::AmqpTransport::connect(url.clone()).await.unwrap());
    let two = Arc::new(courier::AmqpTransport::connect(url).await.unwrap());
    let db = courier_tests::pg::TestDatabase::create().await;
    let store = courier::PostgresStore::from_pool(db.pool().await);
    store.migrate().await.unwrap();
    (one, two, Arc::new(store), db)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_sessions_are_handled_in_order_one_at_a_time_and_in_parallel() {
    let (one, two, store, db) = rabbit_pair().await;
    let name = unique("orders");
    let record = Record::default();
    let e = session_endpoint(one.clone(), store.clone(), &name, step_handler(&record, "a", never)).await;
    send_interleaved(&e).await;
    wait_all(&record).await;
    assert!(check_order(&record, never), "sessions were handled at once");
    assert_eq!(record.all().len(), (SESSIONS * PER_SESSION) as usize);
    e.shutdown().await.unwrap();
    one.delete(&EntityPath::queue(&name)).await.unwrap();
    one.close().await;
    two.close().await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_two_instances_handle_nothing_twice_and_keep_each_session_in_order() {
    let (one, two, store, db) = rabbit_pair().await;
    let name = unique("orders");
    let record = Record::default();
    let a = session_endpoint(one.clone(), store.clone(), &name, step_handler(&record, "a", never)).await;
    let b = session_endpoint(two.clone(), store.clone(), &name, step_handler(&record, "b", never)).await;
    send_interleaved(&a).await;
    wait_all(&record).await;
    check_order(&record, never);
    assert_eq!(record.all().len(), (SESSIONS * PER_SESSION) as usize, "nothing twice");
    // Each session was handled by one instance (the one active on its partition).
    for s in 0..SESSIONS {
        let session = session_name(s);
        let mut by: Vec<&'static str> = record
            .all()
            .iter()
            .filter(|c| c.session == session)
            .map(|c| c.instance)
            .collect();
        by.dedup();
        assert_eq!(
            by.len(),
            1,
            "session {session} went from one instance to the other: {by:?}"
        );
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    one.delete(&EntityPath::queue(&name)).await.unwrap();
    one.close().await;
    two.close().await;
    db.drop_now().await;
}

/// An immediate retry keeps the order; a producer writing straight into a partition a
/// message without a session id gets it dead-lettered with a reason, and the partition
/// goes on (the messages behind it are handled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_a_retry_keeps_the_order_and_a_message_without_a_session_never_blocks() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

    let (one, two, store, db) = rabbit_pair().await;
    let name = unique("orders");
    let record = Record::default();
    let e = session_endpoint(
        one.clone(),
        store.clone(),
        &name,
        step_handler(&record, "a", third_of_even_sessions),
    )
    .await;
    // Straight onto the wire, without a session id, into every partition.
    let conn = lapin::Connection::connect(
        &courier_tests::rabbit::amqp_url().await,
        lapin::ConnectionProperties::default(),
    )
    .await
    .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for p in 0..16 {
        let properties = lapin::BasicProperties::default()
            .with_message_id(format!("raw-{p}").into())
            .with_type("test.SessionStep".into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let partition = format!("{name}::session-{p}-of-16");
        let confirm = channel
            .basic_publish(
                "".into(),
                partition.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                br#"{"session":"raw","seq":0}"#,
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
    conn.close(0, "done".into()).await.unwrap();
    send_interleaved(&e).await;
    wait_all(&record).await;
    check_order(&record, third_of_even_sessions);
    assert!(record.all().iter().all(|c| c.session != "raw"), "no handler saw them");
    let dlq = EntityPath::queue(&name).dead_letter();
    // RabbitMQ cannot browse: the dead letters are received (and completed).
    let receiver = one.receiver(&dlq).await.unwrap();
    let mut dead = Vec::new();
    for _ in 0..100 {
        if dead.len() >= 16 {
            break;
        }
        dead.extend(receiver.receive(16, Duration::from_millis(200)).await.unwrap());
    }
    assert_eq!(dead.len(), 16, "the 16 dead letters");
    for d in dead {
        let d = d.message().clone();
        assert_eq!(
            d.broker.dead_letter_reason.as_deref(),
            Some("courier.InvalidWireFormat"),
            "{d:?}"
        );
        assert!(
            d.broker
                .dead_letter_description
                .as_deref()
                .is_some_and(|t| t.contains("session")),
            "{d:?}"
        );
    }
    let report = e.shutdown().await.unwrap();
    assert_eq!(report.retried, u64::from(SESSIONS / 2));
    one.delete(&EntityPath::queue(&name)).await.unwrap();
    one.close().await;
    two.close().await;
    db.drop_now().await;
}

/// Regression: the endpoint asks each source at start whether it requires sessions, by a
/// receive of no message; the embedded broker takes at least one message per receive,
/// and the message it locked for that question was dropped, locked for the lock duration
/// (60 s): a message waiting in a plain queue before the endpoint started was not handled
/// until then. It is handled at once now, on its first delivery.
#[tokio::test]
async fn embedded_a_message_waiting_in_a_plain_queue_before_the_start_is_handled_at_once() {
    a_message_waiting_before_the_start_is_handled_at_once(None).await;
}

/// The same with a prefetch of one (the sign-up example's news watcher): the probed
/// message filled the prefetch, so the loop asked for no more, and the probed message
/// waited for an answer to a receive never sent (the endpoint handled nothing, ever).
#[tokio::test]
async fn embedded_a_message_waiting_before_the_start_is_handled_with_a_prefetch_of_one() {
    a_message_waiting_before_the_start_is_handled_at_once(Some(1)).await;
}

async fn a_message_waiting_before_the_start_is_handled_at_once(prefetch: Option<usize>) {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let transport: Arc<dyn Transport> = Arc::new(broker.clone());
    transport.create_queue("plain", &QueueOptions::default()).await.unwrap();
    let sender = transport
        .sender("plain", courier::SenderOptions::default())
        .await
        .unwrap();
    let waiting = Step {
        session: "none".into(),
        seq: 7,
    }
    .to_envelope()
    .unwrap();
    sender.send(waiting).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let mut builder = Endpoint::builder("plain")
        .transport(transport.clone())
        .store(broker.store())
        .routes(Routes::new().send::<Step>("plain"))
        .handler(handler_fn("step", move |m: Step, ctx: &mut Context| {
            s.lock().unwrap().push((m.seq, ctx.delivery_count()));
            Box::pin(async { Ok(()) })
        }));
    if let Some(prefetch) = prefetch {
        builder = builder.concurrency(1).prefetch(prefetch);
    }
    let e = builder.start().await.unwrap();
    eventually("the waiting message", || async { !seen.lock().unwrap().is_empty() }).await;
    assert_eq!(*seen.lock().unwrap(), vec![(7, 1)]);
    e.shutdown().await.unwrap();
}
