//! The stores (SQLite, Postgres, the embedded broker's file; on the Postgres transport its
//! own store and a plain Postgres store): the inbox makes a redelivered message's effects
//! happen once, the outbox (or the one transaction) commits what a handler sends with its
//! writes. Each scenario runs on every kind of `StoreKind` (`on_every_store!`); Postgres
//! tests get a database of their own (see `courier_tests::pg`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    unreachable_pub
)]

mod app_data;
mod batch_ids;
mod crash;
mod group;
mod history_checks;
mod history_crash;
mod history_outsiders;
mod history_recent;
mod history_rows;
mod history_upgrade;
mod history_with_sends;
mod refused;
mod restart;
mod sqlite_writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::{
    Clock, Context, Endpoint, EndpointBuilder, EntityPath, HandlerError, PostgresStore, QueueOptions, RetryPolicy,
    Routes, SqliteStore, Store,
};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use courier_tests::stores::StoreEnv;
use refused::{
    a_message_refused_at_dispatch_is_never_retried_forever,
    a_message_too_large_to_send_dead_letters_the_handled_message, a_refused_row_left_behind_does_not_block_the_sweeper,
    an_invalid_destination_or_id_dead_letters_the_handled_message,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.PlaceOrder")]
struct PlaceOrder {
    id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.OrderAccepted")]
struct OrderAccepted {
    id: String,
}

use courier_tests::stores::StoreKind as Kind;

/// What the handler does, shared with the test.
#[derive(Clone)]
struct Probe {
    kind: Kind,
    calls: Arc<AtomicU32>,
    fail_first_attempt: bool,
    gate: Option<Arc<Semaphore>>,
}

#[courier::handler]
async fn place(order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    let probe = ctx.state::<Probe>()?.clone();
    probe.calls.fetch_add(1, Ordering::SeqCst);
    let endpoint = ctx.endpoint().to_owned();
    if probe.kind.postgres() {
        let tx = ctx.transaction::<sqlx::Postgres>()?;
        sqlx::query("INSERT INTO orders (id, endpoint) VALUES ($1, $2)")
            .bind(&order.id)
            .bind(&endpoint)
            .execute(&mut *tx)
            .await?;
    } else {
        let tx = ctx.transaction::<sqlx::Sqlite>()?;
        sqlx::query("INSERT INTO orders (id, endpoint) VALUES (?1, ?2)")
            .bind(&order.id)
            .bind(&endpoint)
            .execute(&mut *tx)
            .await?;
    }
    ctx.send(&OrderAccepted { id: order.id.clone() })?;
    if probe.fail_first_attempt && ctx.attempt() == 1 {
        return Err(HandlerError::msg("fails after writing and sending"));
    }
    if let Some(gate) = &probe.gate
        && let Ok(p) = gate.acquire().await
    {
        p.forget();
    }
    Ok(())
}

/// A broker and a migrated store with an `orders` table.
struct Env(StoreEnv);

impl std::ops::Deref for Env {
    type Target = StoreEnv;
    fn deref(&self) -> &StoreEnv {
        &self.0
    }
}

impl Env {
    async fn new(kind: Kind) -> Self {
        let env = StoreEnv::new(kind).await;
        env.exec("CREATE TABLE orders (id TEXT NOT NULL, endpoint TEXT NOT NULL)")
            .await;
        Self(env)
    }

    fn inbox_count(&self) -> String {
        format!("SELECT COUNT(*) FROM {}", self.kind.table("inbox"))
    }

    fn probe(&self) -> Probe {
        Probe {
            kind: self.kind,
            calls: Arc::new(AtomicU32::new(0)),
            fail_first_attempt: false,
            gate: None,
        }
    }

    fn endpoint(&self, probe: &Probe) -> EndpointBuilder {
        let clock: Arc<dyn Clock> = Arc::new(self.fx.clock.clone());
        Endpoint::builder("sales")
            .transport(self.fx.transport.clone())
            .clock(clock)
            .routes(
                Routes::new()
                    .send::<PlaceOrder>("sales")
                    .send::<OrderAccepted>("accepted"),
            )
            .store(self.store.clone())
            .state(probe.clone())
            .handler(place)
    }

    async fn accepted(&self) -> Vec<String> {
        self.queued_ids("accepted").await
    }

    async fn finish(self) {
        self.0.finish().await;
    }
}

/// The handler succeeds and commits, but its Complete fails because the lock expired
/// (S2.7): the redelivery is recognised by its id, the handler is not called again, the
/// business row exists once and the outgoing message was sent once.
async fn complete_fails_after_commit(kind: Kind) {
    let env = Env::new(kind).await;
    env.fx
        .transport
        .create_queue("accepted", &QueueOptions::default())
        .await
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let mut probe = env.probe();
    probe.gate = Some(gate.clone());
    let sales = env
        .endpoint(&probe)
        .concurrency(1)
        .prefetch(1)
        .max_lock_renewal(Duration::ZERO)
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: "o-1".into() }).await.unwrap();
    eventually("the handler", || async { probe.calls.load(Ordering::SeqCst) == 1 }).await;
    // The lock expires while the handler works; nothing renews it.
    env.fx.clock.advance(Duration::from_secs(61));
    gate.add_permits(10);
    if kind.one_transaction() {
        // The completion is part of the transaction: the expired lock rolls it all back,
        // and the redelivery is handled as if the first attempt never happened.
        eventually("completion", || async { sales.stats().completed == 1 }).await;
        assert_eq!(sales.stats().duplicates, 0);
        assert_eq!(
            probe.calls.load(Ordering::SeqCst),
            2,
            "handled again after the rollback"
        );
    } else {
        eventually("the duplicate", || async { sales.stats().duplicates == 1 }).await;
        eventually("completion", || async { sales.stats().completed == 1 }).await;
        assert_eq!(probe.calls.load(Ordering::SeqCst), 1, "the handler ran once");
    }
    assert_eq!(
        env.count("SELECT COUNT(*) FROM orders").await,
        1,
        "its write happened once"
    );
    assert_eq!(env.accepted().await.len(), 1, "its message was sent once");
    let counts = env.fx.transport.counts(&EntityPath::queue("sales")).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (0, 0));
    sales.shutdown().await.unwrap();
    env.finish().await;
}

/// The handler writes and sends, then fails: nothing of it is visible (no row, no
/// message, no inbox record) and the retry does it all once.
async fn failed_transaction_leaves_nothing(kind: Kind) {
    let env = Env::new(kind).await;
    env.fx
        .transport
        .create_queue("accepted", &QueueOptions::default())
        .await
        .unwrap();
    let mut probe = env.probe();
    probe.fail_first_attempt = true;
    let sales = env.endpoint(&probe).start().await.unwrap();
    sales.bus().send(&PlaceOrder { id: "o-2".into() }).await.unwrap();
    eventually("completion", || async { sales.stats().completed == 1 }).await;
    assert_eq!(probe.calls.load(Ordering::SeqCst), 2);
    assert_eq!(env.count("SELECT COUNT(*) FROM orders").await, 1);
    assert_eq!(env.accepted().await.len(), 1);
    sales.shutdown().await.unwrap();
    env.finish().await;
}

/// The commit succeeds but the dispatch fails (the destination does not exist yet): the
/// message is retried, recognised as processed, and the outbox messages it left are
/// dispatched then, with the ids they were stored with; the handler is not run again.
/// In one transaction with the broker, the missing destination fails the commit itself:
/// nothing is written, and the retry handles the message as new.
async fn dispatch_failure_is_dispatched_on_redelivery(kind: Kind) {
    let env = Env::new(kind).await;
    let probe = env.probe();
    let sales = env
        .endpoint(&probe)
        .recoverability(RetryPolicy::default().immediate(0).delayed([Duration::from_secs(10)]))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: "o-3".into() }).await.unwrap();
    eventually("the delayed retry", || async {
        env.fx
            .transport
            .counts(&EntityPath::queue("sales"))
            .await
            .unwrap()
            .scheduled
            == 1
    })
    .await;
    let committed = if kind.one_transaction() { 0 } else { 1 };
    assert_eq!(env.count("SELECT COUNT(*) FROM orders").await, committed);
    env.fx
        .transport
        .create_queue("accepted", &QueueOptions::default())
        .await
        .unwrap();
    env.fx.clock.advance(Duration::from_secs(10));
    eventually("completion", || async { sales.stats().completed == 1 }).await;
    let (calls, duplicates) = if kind.one_transaction() { (2, 0) } else { (1, 1) };
    assert_eq!(probe.calls.load(Ordering::SeqCst), calls);
    assert_eq!(sales.stats().duplicates, duplicates);
    assert_eq!(env.accepted().await.len(), 1);
    assert_eq!(env.count("SELECT COUNT(*) FROM orders").await, 1);
    sales.shutdown().await.unwrap();
    env.finish().await;
}

/// The dispatch after the commit keeps failing until the retries are exhausted: the
/// message is dead-lettered with `courier.DispatchFailed` (its effects are committed,
/// which `RetriesExhausted` would hide), and the outbox sweeper still sends what it left
/// once the destination exists. In one transaction with the broker the commit itself
/// fails: nothing is committed and the reason is `RetriesExhausted`.
async fn dispatch_that_keeps_failing_says_so(kind: Kind) {
    let env = Env::new(kind).await;
    let probe = env.probe();
    let sales = env
        .endpoint(&probe)
        .recoverability(RetryPolicy::default().immediate(0).delayed([]))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: "o-8".into() }).await.unwrap();
    eventually("the dead letter", || async { sales.stats().dead_lettered == 1 }).await;
    let dead = env
        .fx
        .transport
        .peek(&EntityPath::queue("sales").dead_letter(), 0, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let reason = dead[0].broker.dead_letter_reason.as_deref();
    if kind.one_transaction() {
        assert_eq!(reason, Some(courier::recoverability::reasons::RETRIES_EXHAUSTED));
        assert_eq!(env.count("SELECT COUNT(*) FROM orders").await, 0, "nothing committed");
    } else {
        assert_eq!(reason, Some(courier::recoverability::reasons::DISPATCH_FAILED));
        let description = dead[0].broker.dead_letter_description.as_deref().unwrap_or("");
        assert!(description.contains("committed"), "{description}");
        assert_eq!(env.count("SELECT COUNT(*) FROM orders").await, 1, "committed");
        env.fx
            .transport
            .create_queue("accepted", &QueueOptions::default())
            .await
            .unwrap();
        env.fx.clock.advance(Duration::from_secs(40));
        eventually("the sweep", || async { env.accepted().await.len() == 1 }).await;
    }
    assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
    sales.shutdown().await.unwrap();
    env.finish().await;
}

/// Two instances of one endpoint race on a redelivered message: the second waits for the
/// first's transaction and then sees the inbox record. Effects once.
async fn racing_instances(kind: Kind) {
    let env = Env::new(kind).await;
    env.fx
        .transport
        .create_queue("accepted", &QueueOptions::default())
        .await
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let mut probe = env.probe();
    probe.gate = Some(gate.clone());
    let a = env
        .endpoint(&probe)
        .max_lock_renewal(Duration::ZERO)
        .start()
        .await
        .unwrap();
    let b = env
        .endpoint(&probe)
        .max_lock_renewal(Duration::ZERO)
        .start()
        .await
        .unwrap();
    a.bus().send(&PlaceOrder { id: "o-4".into() }).await.unwrap();
    eventually("the first handler", || async {
        probe.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    // The lock expires: the other instance (or the same one) takes the message again and
    // blocks on the first one's inbox record until it commits.
    env.fx.clock.advance(Duration::from_secs(61));
    if kind.one_transaction() {
        // The broker is part of the first transaction: no instance can take the message
        // again before it ends, and it ends in a rollback (its lock expired).
        gate.add_permits(10);
        eventually("completion", || async {
            a.stats().completed + b.stats().completed == 1
        })
        .await;
        assert_eq!(probe.calls.load(Ordering::SeqCst), 2);
    } else {
        eventually("the second delivery", || async {
            a.stats().running + b.stats().running == 2
        })
        .await;
        gate.add_permits(10);
        eventually("the duplicate", || async {
            a.stats().duplicates + b.stats().duplicates == 1
        })
        .await;
        eventually("completion", || async {
            a.stats().completed + b.stats().completed == 1
        })
        .await;
        assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
    }
    assert_eq!(env.count("SELECT COUNT(*) FROM orders").await, 1);
    // The duplicate may complete while the first instance is still dispatching what it
    // committed (with an outbox the dispatch follows the commit): wait for the message.
    eventually("the outgoing message", || async { !env.accepted().await.is_empty() }).await;
    let mut ids = env.accepted().await;
    ids.dedup();
    assert_eq!(ids.len(), 1, "one outgoing message (a copy would carry the same id)");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    env.finish().await;
}

/// A process died between its commit and its dispatch, and its received message will not
/// come back: the endpoint's outbox sweeper dispatches what it left, once, with the id
/// it was stored with.
async fn outbox_left_behind_is_swept(kind: Kind) {
    let env = Env::new(kind).await;
    env.fx
        .transport
        .create_queue("accepted", &QueueOptions::default())
        .await
        .unwrap();
    let now = courier::Clock::now(&env.fx.clock);
    let envelope = courier::Message::to_envelope(&OrderAccepted { id: "o-5".into() })
        .unwrap()
        .with_message_id("left-behind");
    match env.store.begin("sales", "gone", None, now).await.unwrap() {
        courier::Begin::Fresh(mut work) => {
            work.store_outgoing(vec![("accepted".into(), false, envelope)], now)
                .await
                .unwrap();
            work.commit().await.unwrap();
        }
        courier::Begin::Duplicate(_) => panic!("a fresh id"),
    }
    let probe = env.probe();
    let sales = env.endpoint(&probe).start().await.unwrap();
    assert!(
        env.accepted().await.is_empty(),
        "young rows are the normal path's, not the sweeper's"
    );
    env.fx.clock.advance(Duration::from_secs(40));
    eventually("the sweep", || async { env.accepted().await.len() == 1 }).await;
    assert_eq!(env.accepted().await, vec!["left-behind".to_owned()]);
    eventually("removed from the outbox once sent", || async {
        let later = courier::Clock::now(&env.fx.clock) + chrono::Duration::seconds(1);
        env.store.undispatched("sales", later, 10).await.unwrap().is_empty()
    })
    .await;
    env.fx.clock.advance(Duration::from_secs(40));
    sales.shutdown().await.unwrap();
    assert_eq!(env.accepted().await.len(), 1, "sent once");
    env.finish().await;
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Kind::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Kind::Postgres).await;
                }
            )*
        }
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Kind::Embedded).await;
                }
            )*
        }
        mod pg_transport {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Kind::PgTransport).await;
                }
            )*
        }
        mod pg_transport_outbox {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Kind::PgTransportOutbox).await;
                }
            )*
        }
    };
}

on_every_store!(
    complete_fails_after_commit,
    failed_transaction_leaves_nothing,
    dispatch_failure_is_dispatched_on_redelivery,
    racing_instances,
    outbox_left_behind_is_swept,
    retention_runs_by_itself,
    dispatch_that_keeps_failing_says_so,
    a_message_too_large_to_send_dead_letters_the_handled_message,
    a_message_refused_at_dispatch_is_never_retried_forever,
    a_refused_row_left_behind_does_not_block_the_sweeper,
    an_invalid_destination_or_id_dead_letters_the_handled_message,
    the_endpoint_secret_is_made_once_and_shared,
);

/// `Store::endpoint_secret`: the first call for an endpoint makes its secret, every later
/// one (from any process: calls racing to make it included) reads the same; endpoints have
/// secrets of their own. The endpoint seals its delayed retries' counts with it
/// (`tests/endpoint/forged_retry_count.rs`).
async fn the_endpoint_secret_is_made_once_and_shared(kind: Kind) {
    let env = StoreEnv::new(kind).await;
    let now = env.fx.clock.now();
    let mut racing = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let store = env.store.clone();
        racing.spawn(async move { store.endpoint_secret("sales", now).await.unwrap().unwrap() });
    }
    let first = racing.join_next().await.unwrap().unwrap();
    while let Some(other) = racing.join_next().await {
        assert_eq!(other.unwrap(), first, "every caller gets the one secret");
    }
    let later = env.store.endpoint_secret("sales", now).await.unwrap().unwrap();
    assert_eq!(later, first);
    let billing = env.store.endpoint_secret("billing", now).await.unwrap().unwrap();
    assert_ne!(billing, first);
    assert_ne!(first.as_bytes(), &[0; 32]);
    let table = kind.table("endpoint_secret");
    assert_eq!(env.count(&format!("SELECT count(*) FROM {table}")).await, 2);
    env.finish().await;
}

/// Courier's Postgres tables live in the schema `courier`, with their migrations table;
/// the application's schema and its own `_sqlx_migrations` are untouched, and migrating
/// twice is harmless.
#[tokio::test]
async fn postgres_migrations_stay_in_their_schema() {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT table_schema::text, table_name::text FROM information_schema.tables \
         WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let names: Vec<String> = tables.iter().map(|(s, t)| format!("{s}.{t}")).collect();
    assert!(names.iter().all(|n| n.starts_with("courier.")), "{names:?}");
    for table in [
        "courier.inbox",
        "courier.migrations",
        "courier.outbox",
        "courier.saga",
        "courier.saga_timeout",
    ] {
        assert!(names.iter().any(|n| n == table), "{table} missing from {names:?}");
    }
    pool.close().await;
    db.drop_now().await;
}

/// Courier's SQLite tables carry the prefix `courier_`.
#[tokio::test]
async fn sqlite_tables_carry_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db")).await.unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let names: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert!(names.iter().all(|n| n.starts_with("courier_")), "{names:?}");
    assert!(names.contains(&"courier_inbox".to_owned()) && names.contains(&"courier_outbox".to_owned()));
}

/// A migrated `SqliteStore` in `dir` over a pool of `connections` whose busy timeout is
/// zero: a writer that met another's transaction would fail at once.
async fn store_without_busy_timeout(dir: &std::path::Path, connections: u32) -> SqliteStore {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("s.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::ZERO);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(connections)
        .connect_with(options)
        .await
        .unwrap();
    let store = SqliteStore::from_pool(pool);
    store.migrate().await.unwrap();
    store
}

/// The SQLite store's own writers take turns in the process before they ask SQLite for
/// its write lock: concurrent transactions wait for their turn, even with no busy timeout
/// at all. Before, each polled for the lock with SQLite's busy sleeps (up to 100 ms each,
/// hundreds of milliseconds late under load); here, with no busy timeout, they failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writers_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_without_busy_timeout(dir.path(), 8).await;
    let now = chrono::Utc::now();
    let writers: Vec<_> = (0..32)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                match store.begin("e", &format!("m{i}"), None, now).await? {
                    courier::Begin::Fresh(work) => work.commit().await.map(drop),
                    courier::Begin::Duplicate(_) => panic!("fresh ids"),
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }
    let recorded: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier_inbox")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(recorded, 32);
}

/// A `SqliteStore` unit of work dropped before its commit (a failed handler, a stopped
/// task) is rolled back before the next writer's turn (and the writer connection the
/// turn holds): with no busy timeout at all, the next transactions begin at once, none
/// meets the dropped one, and none of its inbox record, outbox message or history event
/// is kept. The store ends its transactions with its own `ROLLBACK` and `COMMIT` (the
/// history event rides in the query of the `COMMIT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_dropped_unit_of_work_is_rolled_back_before_the_next_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_without_busy_timeout(dir.path(), 4).await;
    let now = chrono::Utc::now();
    let event = |id: &str| courier::HistoryEvent {
        endpoint: "e".to_owned(),
        kind: courier::HistoryKind::Handled,
        at: now,
        message_id: id.to_owned(),
        message_type: Some("e.Job".to_owned()),
        conversation_id: None,
        causation_id: None,
        attempt: 1,
        enqueued_at: None,
        received_at: None,
        detail: courier::HistoryDetail::default(),
    };
    let outgoing = |id: &str| {
        vec![(
            "done".to_owned(),
            false,
            courier::Envelope::new("{}").with_message_id(format!("out-{id}")),
        )]
    };
    let writers: Vec<_> = (0..16)
        .map(|i| {
            let (store, id) = (store.clone(), format!("m{i}"));
            let (event, outgoing) = (event(&id), outgoing(&id));
            tokio::spawn(async move {
                // The first attempt writes everything, then is dropped.
                match store.begin("e", &id, None, now).await.unwrap() {
                    courier::Begin::Fresh(mut work) => {
                        work.store_outgoing(outgoing.clone(), now).await.unwrap();
                        work.record_history(&event).await.unwrap();
                        drop(work);
                    }
                    courier::Begin::Duplicate(_) => panic!("a fresh id"),
                }
                // The second finds no trace of it, and commits.
                match store.begin("e", &id, None, now).await.unwrap() {
                    courier::Begin::Fresh(mut work) => {
                        work.store_outgoing(outgoing, now).await.unwrap();
                        work.record_history(&event).await.unwrap();
                        work.commit().await.unwrap();
                    }
                    courier::Begin::Duplicate(_) => panic!("the dropped attempt left its inbox record"),
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    for (table, expected) in [
        ("courier_inbox", 16),
        ("courier_outbox", 16),
        ("courier_history_all", 16),
    ] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(n, expected, "{table}: the committed attempts' rows only");
    }
}

/// What `Context::transaction` says of a `SqliteStore`'s transaction: sqlx's `begin()` on
/// it is refused (the transaction is SQLite's, begun by a statement), a `SAVEPOINT`
/// written by hand works, and the refusal leaves the transaction usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_nested_begin_is_refused_and_a_savepoint_works() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db")).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE notes (id TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let now = chrono::Utc::now();
    let courier::Begin::Fresh(mut work) = store.begin("e", "m-1", None, now).await.unwrap() else {
        panic!("a fresh id");
    };
    let conn = work
        .transaction()
        .and_then(|t| t.downcast_mut::<sqlx::SqliteConnection>())
        .unwrap();
    assert!(conn.begin().await.is_err(), "a nested begin is refused");
    for sql in [
        "INSERT INTO notes VALUES ('kept')",
        "SAVEPOINT part",
        "INSERT INTO notes VALUES ('undone')",
        "ROLLBACK TO part",
        "RELEASE part",
    ] {
        sqlx::query(sql).execute(&mut *conn).await.unwrap();
    }
    work.commit().await.unwrap();
    let notes: Vec<String> = sqlx::query_scalar("SELECT id FROM notes")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(notes, vec!["kept".to_owned()]);
}

/// The retention cleanup deletes old inbox records in short bounded statements, only the
/// given endpoint's.
#[tokio::test]
async fn inbox_purge_is_bounded() {
    for kind in [Kind::Sqlite, Kind::Postgres, Kind::Embedded] {
        let env = Env::new(kind).await;
        let t0 = courier::Clock::now(&env.fx.clock);
        for (endpoint, i) in (0..5).map(|i| ("e", i)).chain([("f", 9)]) {
            let id = format!("m{i}");
            match env.store.begin(endpoint, &id, None, t0).await.unwrap() {
                courier::Begin::Fresh(work) => drop(work.commit().await.unwrap()),
                courier::Begin::Duplicate(_) => panic!("fresh ids"),
            }
        }
        let later = t0 + chrono::Duration::seconds(1);
        assert_eq!(env.store.purge_inbox("e", later, 3).await.unwrap(), 3);
        assert_eq!(env.store.purge_inbox("e", later, 3).await.unwrap(), 2);
        assert_eq!(env.store.purge_inbox("e", later, 3).await.unwrap(), 0);
        assert_eq!(env.store.purge_inbox("f", t0, 3).await.unwrap(), 0, "not older than t0");
        assert_eq!(
            env.count(&env.inbox_count()).await,
            1,
            "the other endpoint's record stays"
        );
        env.finish().await;
    }
}

/// The endpoint purges its own expired inbox records by itself (every minute, by its
/// clock), and keeps the young ones and other endpoints' records.
async fn retention_runs_by_itself(kind: Kind) {
    let env = Env::new(kind).await;
    env.fx
        .transport
        .create_queue("accepted", &QueueOptions::default())
        .await
        .unwrap();
    let t0 = courier::Clock::now(&env.fx.clock);
    match env.store.begin("billing", "other-endpoint", None, t0).await.unwrap() {
        courier::Begin::Fresh(work) => drop(work.commit().await.unwrap()),
        courier::Begin::Duplicate(_) => panic!("a fresh id"),
    }
    let probe = env.probe();
    let sales = env
        .endpoint(&probe)
        .inbox_retention(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: "o-6".into() }).await.unwrap();
    eventually("completion", || async { sales.stats().completed == 1 }).await;
    assert_eq!(env.count(&env.inbox_count()).await, 2);
    env.fx.clock.advance(Duration::from_secs(1800));
    sales.bus().send(&PlaceOrder { id: "o-7".into() }).await.unwrap();
    eventually("completion", || async { sales.stats().completed == 2 }).await;
    // An hour after the first: its record goes at the next purge, the second's stays.
    env.fx.clock.advance(Duration::from_secs(1800 + 61));
    eventually("the purge", || async { sales.stats().inbox_purged == 1 }).await;
    assert_eq!(
        env.count(&env.inbox_count()).await,
        2,
        "the young record and billing's stay"
    );
    sales.shutdown().await.unwrap();
    env.finish().await;
}
