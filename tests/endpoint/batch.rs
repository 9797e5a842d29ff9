//! Batch handlers (issue 32; docs/endpoints.md, "Batch handlers"), declared with
//! `#[courier::handler]` on a function of `Batch<T>`: batches of at most `max_messages`,
//! handed over when full or when the first message waited `max_wait` by the endpoint's
//! (virtual) clock; ONE transaction per batch on each store (the rows the handler
//! writes with one statement are there exactly once per message); a redelivered message
//! already handled is not handed over again; a message that fails the batch is found by
//! handling the batch's messages one by one and is dead-lettered alone while the others
//! succeed; what an endpoint refuses at start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::{
    Batch, BatchContext, BatchOptions, Clock, Embedded, Endpoint, EndpointBuilder, ErrorKind, HandlerError,
    QueueOptions, RetryPolicy, Routes, SendOptions, Store, Transport, VirtualClock, recoverability::reasons,
};
use courier_tests::eventually;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "test.Click")]
pub struct Click {
    pub n: u32,
    /// A click the handler refuses (a bad row), every time.
    pub poison: bool,
}

/// What the handler saw: the size of each call, and each message's number per call.
#[derive(Clone, Default)]
pub(crate) struct Seen {
    calls: Arc<Mutex<Vec<Vec<u32>>>>,
}

impl Seen {
    pub(crate) fn calls(&self) -> Vec<Vec<u32>> {
        self.calls.lock().unwrap().clone()
    }
    /// How often each number was in a call that succeeded is checked in the database;
    /// this counts what the handler was handed.
    fn handed(&self) -> HashMap<u32, usize> {
        let mut out = HashMap::new();
        for n in self.calls().into_iter().flatten() {
            *out.entry(n).or_insert(0) += 1;
        }
        out
    }
}

/// Records the batch, then writes its rows with one statement in the store's
/// transaction (SQLite or Postgres, whichever the endpoint has; none without a store).
#[courier::handler]
pub(crate) async fn record_clicks(batch: Batch<Click>, ctx: &mut BatchContext) -> Result<(), HandlerError> {
    let seen = ctx.state::<Seen>()?.clone();
    let table = ctx.state::<PgTable>().ok().map(|t| t.0.clone());
    let numbers: Vec<u32> = batch.messages().iter().map(|c| c.n).collect();
    seen.calls.lock().unwrap().push(numbers.clone());
    if batch.messages().iter().any(|c| c.poison) {
        return Err(HandlerError::msg("a click of the batch is poison"));
    }
    let ids: Vec<String> = batch.received().iter().map(|r| r.envelope.message_id.clone()).collect();
    if let Ok(tx) = ctx.transaction::<courier::sqlx::Sqlite>() {
        sqlx::query("CREATE TABLE IF NOT EXISTS batch_clicks (message_id TEXT PRIMARY KEY, n INTEGER NOT NULL)")
            .execute(&mut *tx)
            .await?;
        let mut insert = String::from("INSERT INTO batch_clicks (message_id, n) VALUES ");
        let values: Vec<String> = (0..ids.len())
            .map(|i| format!("(?{}, ?{})", 2 * i + 1, 2 * i + 2))
            .collect();
        insert.push_str(&values.join(", "));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(insert));
        for (id, n) in ids.iter().zip(&numbers) {
            q = q.bind(id.clone()).bind(i64::from(*n));
        }
        q.execute(&mut *tx).await?;
    } else if let (Ok(tx), Some(table)) = (ctx.transaction::<courier::sqlx::Postgres>(), table) {
        let numbers: Vec<i64> = numbers.iter().map(|n| i64::from(*n)).collect();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (message_id, n) SELECT * FROM unnest($1::text[], $2::bigint[])"
        )))
        .bind(&ids)
        .bind(&numbers)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// The table the handler writes on Postgres (each test its own).
#[derive(Clone)]
struct PgTable(String);

pub(crate) fn clicks_endpoint(
    transport: Arc<dyn Transport>,
    clock: &VirtualClock,
    name: &str,
    seen: &Seen,
    options: BatchOptions,
) -> EndpointBuilder {
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    Endpoint::builder(name)
        .transport(transport)
        .clock(shared)
        .routes(Routes::new().send::<Click>(name))
        .recoverability(RetryPolicy::default().immediate(2).delayed([]))
        .receive_wait(Duration::from_millis(100))
        .shutdown_timeout(Duration::from_secs(10))
        .state(seen.clone())
        .batch_handler(record_clicks, options)
}

pub(crate) async fn embedded(clock: &VirtualClock) -> Embedded {
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    Embedded::builder().in_memory().clock(shared).open().await.unwrap()
}

pub(crate) async fn send_clicks(
    endpoint: &courier::RunningEndpoint,
    numbers: impl IntoIterator<Item = u32>,
    poison: u32,
) {
    for n in numbers {
        endpoint.bus().send(&Click { n, poison: n == poison }).await.unwrap();
    }
}

/// Waits until `done`, moving the virtual clock on by `step` meanwhile (batches that are
/// not full wait for it).
pub(crate) async fn advancing_until<F, Fut>(clock: &VirtualClock, step: Duration, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually(what, || {
        clock.advance(step);
        done()
    })
    .await;
}

pub(crate) async fn sqlite_rows(broker: &Embedded) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT message_id, n FROM batch_clicks ORDER BY n")
        .fetch_all(broker.read_pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_batches_are_full_or_wait_for_the_time_limit_and_write_each_row_once() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let seen = Seen::default();
    let options = BatchOptions::new().max_messages(10).max_wait(Duration::from_secs(5));
    let e = clicks_endpoint(Arc::new(broker.clone()), &clock, "clicks", &seen, options)
        .store(broker.store())
        .start()
        .await
        .unwrap();
    // 25 clicks: two full batches at once; the last 5 wait for the time limit.
    send_clicks(&e, 0..25, u32::MAX).await;
    eventually("two full batches", || async { seen.calls().len() >= 2 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = seen.calls();
    assert_eq!(calls.len(), 2, "the third batch waits for its time limit: {calls:?}");
    assert!(calls.iter().all(|c| c.len() == 10), "{calls:?}");
    clock.advance(Duration::from_secs(5));
    eventually("the batch the time limit handed over", || async {
        seen.calls().len() == 3
    })
    .await;
    assert_eq!(seen.calls()[2].len(), 5);
    courier_tests::eventually("the rows", || async { sqlite_rows(&broker).await.len() == 25 }).await;
    let report = e.shutdown().await.unwrap();
    assert_eq!(report.completed, 25);
    let rows = sqlite_rows(&broker).await;
    assert_eq!(
        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        (0..25).collect::<Vec<i64>>()
    );
    let counts = broker.counts(&courier::EntityPath::queue("clicks")).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_message_that_fails_its_batch_is_dead_lettered_alone_and_the_others_succeed() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let seen = Seen::default();
    let options = BatchOptions::new().max_messages(8).max_wait(Duration::from_millis(500));
    let e = clicks_endpoint(Arc::new(broker.clone()), &clock, "clicks", &seen, options)
        .store(broker.store())
        .start()
        .await
        .unwrap();
    send_clicks(&e, 0..16, 5).await;
    advancing_until(
        &clock,
        Duration::from_millis(100),
        "15 rows and a dead letter",
        || async {
            let rows = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM batch_clicks")
                .fetch_one(broker.read_pool())
                .await
                .unwrap_or(0);
            let counts = broker.counts(&courier::EntityPath::queue("clicks")).await.unwrap();
            rows == 15 && counts.dead_lettered == 1
        },
    )
    .await;
    e.shutdown().await.unwrap();
    let rows = sqlite_rows(&broker).await;
    let numbers: Vec<i64> = rows.iter().map(|r| r.1).collect();
    assert_eq!(
        numbers,
        (0..16).filter(|n| *n != 5).collect::<Vec<i64>>(),
        "each good click once"
    );
    let dead = broker
        .peek(&courier::EntityPath::queue("clicks").dead_letter(), 0, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let body: Click = serde_json::from_slice(dead[0].body()).unwrap();
    assert_eq!(body.n, 5, "the poison click alone");
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(reasons::RETRIES_EXHAUSTED)
    );
    assert!(
        dead[0]
            .broker
            .dead_letter_description
            .as_deref()
            .is_some_and(|d| d.contains("poison")),
        "{:?}",
        dead[0].broker
    );
    // The poison click was handed alone after its batch failed, then retried alone.
    let alone = seen.calls().iter().filter(|c| c.as_slice() == [5]).count();
    assert!(alone >= 2, "{:?}", seen.calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_redelivered_message_already_handled_is_not_handed_to_a_batch_again() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let seen = Seen::default();
    let options = BatchOptions::new().max_messages(4).max_wait(Duration::from_millis(200));
    let e = clicks_endpoint(Arc::new(broker.clone()), &clock, "clicks", &seen, options)
        .store(Arc::new(broker.store()) as Arc<dyn Store>)
        .start()
        .await
        .unwrap();
    // The same message (one id) three times, and three others: one row each.
    for _ in 0..3 {
        e.bus()
            .send_with(
                &Click { n: 100, poison: false },
                SendOptions::new().message_id("click-100"),
            )
            .await
            .unwrap();
    }
    send_clicks(&e, 1..4, u32::MAX).await;
    advancing_until(&clock, Duration::from_millis(100), "all six settled", || async {
        let c = broker.counts(&courier::EntityPath::queue("clicks")).await.unwrap();
        c.active == 0
    })
    .await;
    assert_eq!(e.stats().duplicates, 2);
    e.shutdown().await.unwrap();
    let rows = sqlite_rows(&broker).await;
    assert_eq!(rows.iter().map(|r| r.1).collect::<Vec<_>>(), vec![1, 2, 3, 100]);
    assert_eq!(seen.handed().get(&100), Some(&1), "{:?}", seen.calls());
}

/// With a history, a batch writes one handled event per message it handled, and a
/// duplicate event for each redelivery the inbox dropped, as one-message handling does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_with_a_sqlite_store_of_its_own_commits_then_completes() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let dir = tempfile::tempdir().unwrap();
    let store = courier::SqliteStore::open(dir.path().join("store.db")).await.unwrap();
    store.migrate().await.unwrap();
    let seen = Seen::default();
    let options = BatchOptions::new()
        .max_messages(16)
        .max_wait(Duration::from_millis(100));
    let e = clicks_endpoint(Arc::new(broker.clone()), &clock, "clicks", &seen, options)
        .store(store.clone())
        .start()
        .await
        .unwrap();
    send_clicks(&e, 0..40, u32::MAX).await;
    advancing_until(&clock, Duration::from_millis(50), "40 settled", || async {
        let c = broker.counts(&courier::EntityPath::queue("clicks")).await.unwrap();
        c.active == 0
    })
    .await;
    let report = e.shutdown().await.unwrap();
    assert_eq!(report.completed, 40);
    let handed = seen.handed();
    assert_eq!(handed.len(), 40);
    assert!(handed.values().all(|n| *n == 1), "{handed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transport_batches_write_each_row_once_in_one_transaction_each() {
    let clock = VirtualClock::starting_now();
    let transport = Arc::new(courier_tests::pg_transport::transport(&clock).await);
    let name = format!("clicks-{}", uuid::Uuid::new_v4().simple());
    let table = format!("batch_clicks_{}", uuid::Uuid::new_v4().simple());
    let pool = courier::sqlx::PgPool::connect_with(courier_tests::pg_transport::database().await)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (message_id TEXT PRIMARY KEY, n BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let seen = Seen::default();
    let options = BatchOptions::new()
        .max_messages(10)
        .max_wait(Duration::from_millis(200))
        .concurrency(2);
    let e = clicks_endpoint(transport.clone(), &clock, &name, &seen, options)
        .store(transport.store())
        .state(PgTable(table.clone()))
        .start()
        .await
        .unwrap();
    send_clicks(&e, 0..100, 42).await;
    advancing_until(
        &clock,
        Duration::from_millis(100),
        "99 rows and a dead letter",
        || async {
            let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&pool)
                .await
                .unwrap();
            let c = transport.counts(&courier::EntityPath::queue(&name)).await.unwrap();
            rows == 99 && c.dead_lettered == 1 && c.active == 0
        },
    )
    .await;
    e.shutdown().await.unwrap();
    let numbers: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT n FROM {table} ORDER BY n")))
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(numbers, (0..100).filter(|n| *n != 42).collect::<Vec<i64>>());
    // Full batches of ten where the poison click was not.
    assert!(
        seen.calls().iter().filter(|c| c.len() == 10).count() >= 5,
        "{:?}",
        seen.calls()
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&pool)
        .await
        .unwrap();
    transport.delete(&courier::EntityPath::queue(&name)).await.unwrap();
}

#[tokio::test]
async fn an_endpoint_refuses_batch_handlers_where_a_batch_cannot_keep_its_promises() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let seen = Seen::default();
    let refused = |e: courier::Error| match e.kind() {
        ErrorKind::InvalidOptions { reason } => reason.clone(),
        other => panic!("{other:?}"),
    };
    let sessions = clicks_endpoint(Arc::new(broker.clone()), &clock, "s", &seen, BatchOptions::new())
        .queue_options(QueueOptions::default().requires_session(true))
        .start()
        .await
        .unwrap_err();
    assert!(refused(sessions).contains("sessions"));
    let grouped = clicks_endpoint(Arc::new(broker.clone()), &clock, "g", &seen, BatchOptions::new())
        .group_commit(8)
        .start()
        .await
        .unwrap_err();
    assert!(refused(grouped).contains("group_commit(1)"));
    let limits = clicks_endpoint(
        Arc::new(broker.clone()),
        &clock,
        "l",
        &seen,
        BatchOptions::new().max_messages(0),
    )
    .start()
    .await
    .unwrap_err();
    assert!(refused(limits).contains("1 to 10000"));
    let long_wait = clicks_endpoint(
        Arc::new(broker.clone()),
        &clock,
        "w",
        &seen,
        BatchOptions::new().max_wait(Duration::from_secs(40)),
    )
    .start()
    .await
    .unwrap_err();
    assert!(refused(long_wait).contains("lock duration"));
    let both = clicks_endpoint(Arc::new(broker.clone()), &clock, "b", &seen, BatchOptions::new())
        .handler(crate::support::handler_fn("one", |_: Click, _| crate::support::ok()))
        .start()
        .await
        .unwrap_err();
    assert!(refused(both).contains("no other handler"));
}

/// `courier::testing::TestEndpoint`: a batch that waits for its time limit waits for the
/// virtual clock (`send` returns, nothing is handed over), and `advance` hands it over.
#[tokio::test]
async fn test_endpoint_hands_a_batch_over_when_the_virtual_clock_reaches_its_time_limit() {
    let seen = Seen::default();
    let state = seen.clone();
    let t = courier::testing::TestEndpoint::start("clicks", move |e| {
        e.routes(Routes::new().send::<Click>("clicks"))
            .state(state)
            .batch_handler(
                record_clicks,
                BatchOptions::new().max_messages(10).max_wait(Duration::from_secs(2)),
            )
    })
    .await
    .unwrap();
    for n in 0..3 {
        t.send(&Click { n, poison: false }).await.unwrap();
    }
    assert!(
        seen.calls().is_empty(),
        "the batch waits for its time limit: {:?}",
        seen.calls()
    );
    t.advance(Duration::from_secs(1)).await.unwrap();
    assert!(seen.calls().is_empty(), "one second is not two: {:?}", seen.calls());
    t.advance(Duration::from_secs(1)).await.unwrap();
    assert_eq!(seen.calls(), vec![vec![0, 1, 2]]);
    assert_eq!(t.handled().await.unwrap(), 3);
    t.shutdown().await.unwrap();
}

/// A batch handler that waits at a gate: the test moves the virtual clock while it runs.
struct Gated {
    gate: Arc<tokio::sync::Semaphore>,
    calls: Arc<Mutex<usize>>,
}

impl courier::BatchHandler for Gated {
    type Message = Click;
    fn name(&self) -> &'static str {
        "gated"
    }
    fn handle<'a>(
        &'a self,
        _batch: Batch<Click>,
        _ctx: &'a mut BatchContext,
    ) -> courier::BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            *self.calls.lock().unwrap() += 1;
            let _pass = self.gate.acquire().await.map_err(HandlerError::transient)?;
            Ok(())
        })
    }
}

/// The locks of a batch's messages are renewed while its handler runs: a handler that
/// takes longer than the lock duration (by the virtual clock) still commits, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transport_a_batch_that_outlasts_the_lock_duration_keeps_its_locks() {
    let clock = VirtualClock::starting_now();
    let transport = Arc::new(courier_tests::pg_transport::transport(&clock).await);
    let name = format!("clicks-{}", uuid::Uuid::new_v4().simple());
    let handler = Gated {
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
        calls: Arc::default(),
    };
    let (gate, calls) = (handler.gate.clone(), handler.calls.clone());
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let e = Endpoint::builder(&name)
        .transport(transport.clone())
        .clock(shared)
        .routes(Routes::new().send::<Click>(&name))
        .receive_wait(Duration::from_millis(100))
        .store(transport.store())
        .batch_handler(
            handler,
            BatchOptions::new().max_messages(3).max_wait(Duration::from_secs(1)),
        )
        .start()
        .await
        .unwrap();
    send_clicks(&e, 0..3, u32::MAX).await;
    eventually("the batch started", || async { *calls.lock().unwrap() == 1 }).await;
    // Two lock durations (60 s) go by while the handler runs.
    for _ in 0..24 {
        clock.advance(Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.add_permits(100);
    eventually("the batch committed", || async {
        transport
            .counts(&courier::EntityPath::queue(&name))
            .await
            .unwrap()
            .active
            == 0
    })
    .await;
    let report = e.shutdown().await.unwrap();
    assert_eq!(report.completed, 3);
    assert_eq!(*calls.lock().unwrap(), 1, "the batch ran once: its locks held");
    transport.delete(&courier::EntityPath::queue(&name)).await.unwrap();
}

/// RabbitMQ (no locks; the outbox) with a Postgres store of its own: two instances
/// share the queue; each row once, the poison click dead-lettered alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_two_instances_with_a_postgres_store_write_each_row_once() {
    let clock = VirtualClock::starting_now();
    let url = courier_tests::rabbit::amqp_url().await;
    let one = Arc::new(courier::AmqpTransport::connect(url.clone()).await.unwrap());
    let two = Arc::new(courier::AmqpTransport::connect(url).await.unwrap());
    let db = courier_tests::pg::TestDatabase::create().await;
    let pool = db.pool().await;
    let store = courier::PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let table = "rabbit_clicks";
    sqlx::query("CREATE TABLE rabbit_clicks (message_id TEXT PRIMARY KEY, n BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let name = format!("clicks-{}", uuid::Uuid::new_v4().simple());
    let seen = Seen::default();
    let options = BatchOptions::new()
        .max_messages(10)
        .max_wait(Duration::from_millis(300));
    let mut running = Vec::new();
    for transport in [one.clone(), two.clone()] {
        running.push(
            clicks_endpoint(transport, &clock, &name, &seen, options)
                .store(store.clone())
                .state(PgTable(table.to_owned()))
                .start()
                .await
                .unwrap(),
        );
    }
    send_clicks(&running[0], 0..60, 7).await;
    advancing_until(
        &clock,
        Duration::from_millis(100),
        "59 rows and a dead letter",
        || async {
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM rabbit_clicks")
                .fetch_one(&pool)
                .await
                .unwrap();
            let c = one.counts(&courier::EntityPath::queue(&name)).await.unwrap();
            rows == 59 && c.dead_lettered == 1
        },
    )
    .await;
    for e in running {
        e.shutdown().await.unwrap();
    }
    let numbers: Vec<i64> = sqlx::query_scalar("SELECT n FROM rabbit_clicks ORDER BY n")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(numbers, (0..60).filter(|n| *n != 7).collect::<Vec<i64>>());
    one.delete(&courier::EntityPath::queue(&name)).await.unwrap();
    one.close().await;
    two.close().await;
    db.drop_now().await;
}

/// One message a producer sends, as many times as `copies` (the same id each time).
#[derive(Debug, Clone)]
struct Sent {
    poison: bool,
    /// A body no `Click` decodes from.
    garbage: bool,
    copies: usize,
}

fn sent() -> impl proptest::strategy::Strategy<Value = Sent> {
    use proptest::prelude::*;
    (prop::bool::weighted(0.1), prop::bool::weighted(0.05), 1..=3usize).prop_map(|(poison, garbage, copies)| Sent {
        poison,
        garbage,
        copies,
    })
}

/// Over any mix of good, poison and undecodable messages, each sent up to three times,
/// and any batch size and number of batches at once: every good message's row is written
/// exactly once (the table's primary key would fail a second write, and with it the
/// message), only the bad ones are dead-lettered (each copy: the inbox keeps no record of
/// a failure), and every good message was handed over.
#[test]
fn any_mix_of_messages_and_batch_limits_writes_each_good_row_once() {
    use proptest::prelude::*;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let input = (proptest::collection::vec(sent(), 0..24), 1..=12usize, 1..=3usize);
    courier_tests::run_property(
        &rt,
        courier_tests::fuzz_cases(24),
        &input,
        |_, (messages, max, at_once)| async move {
            let seen = Seen::default();
            let state = seen.clone();
            let options = BatchOptions::new()
                .max_messages(max)
                .max_wait(Duration::from_secs(1))
                .concurrency(at_once);
            let t = courier::testing::TestEndpoint::start("clicks", move |e| {
                e.routes(Routes::new().send::<Click>("clicks"))
                    .recoverability(RetryPolicy::default().immediate(1).delayed([]))
                    .state(state)
                    .batch_handler(record_clicks, options)
            })
            .await
            .unwrap();
            let sender = t
                .broker()
                .sender("clicks", courier::SenderOptions::default())
                .await
                .unwrap();
            let mut bad_copies = 0;
            let mut good = Vec::new();
            for (n, m) in messages.iter().enumerate() {
                let n = u32::try_from(n).unwrap();
                let body = if m.garbage {
                    b"{\"n\": \"not a number\"}".to_vec()
                } else {
                    serde_json::to_vec(&Click { n, poison: m.poison }).unwrap()
                };
                let envelope = courier::Envelope::new(body)
                    .with_message_id(format!("click-{n}"))
                    .with_message_type("test.Click")
                    .with_content_type("application/json");
                for _ in 0..m.copies {
                    sender.send(envelope.clone()).await.unwrap();
                }
                if m.poison || m.garbage {
                    bad_copies += m.copies;
                } else {
                    good.push(i64::from(n));
                }
            }
            // Hand over every batch waiting for its time limit, retries included.
            for _ in 0..8 {
                t.advance(Duration::from_secs(1)).await.unwrap();
            }
            let rows: Vec<i64> = if good.is_empty() {
                Vec::new()
            } else {
                sqlx::query_scalar("SELECT n FROM batch_clicks ORDER BY n")
                    .fetch_all(t.read_pool())
                    .await
                    .unwrap()
            };
            prop_assert_eq!(&rows, &good, "each good row once");
            let dead = t.dead_lettered().await.unwrap();
            prop_assert_eq!(
                dead.len(),
                bad_copies,
                "{:?}",
                dead.iter().map(|d| &d.reason).collect::<Vec<_>>()
            );
            for d in &dead {
                let n: usize = d.envelope.message_id.trim_start_matches("click-").parse().unwrap();
                let m = &messages[n];
                prop_assert!(
                    m.poison || m.garbage,
                    "a good message was dead-lettered: {:?}",
                    d.description
                );
            }
            let handed = seen.handed();
            for n in &good {
                let n = u32::try_from(*n).unwrap();
                prop_assert!(handed.get(&n).copied().unwrap_or(0) >= 1);
            }
            t.shutdown().await.unwrap();
            Ok(())
        },
    );
}
