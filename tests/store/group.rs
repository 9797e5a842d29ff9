//! Group commit on Postgres (`EndpointBuilder::group_commit`): messages received together
//! share one transaction, and each keeps the guarantees it has alone. Every order row
//! records `txid_current()`, so a test sees which handlings shared a transaction. Each
//! scenario runs on a `PostgresStore` (beside the embedded broker) and on the Postgres
//! transport's own store, where the group's transaction also sends every member's
//! messages and completes its received message.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use courier::{
    Clock, Context, Endpoint, EndpointBuilder, EntityPath, Envelope, HandlerError, Message, QueueOptions, Routes,
    SenderOptions,
};
use courier_tests::eventually;
use courier_tests::stores::{StoreEnv, StoreKind};
use serde::{Deserialize, Serialize};

/// What a group's commit can meet on its way: the order of its members' sends, a queue
/// deleted meanwhile, values Postgres cannot store.
mod edges;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "group.Order")]
struct Order {
    id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "group.Accepted")]
struct Accepted {
    id: String,
}

/// What the handler does with an order, by its id.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Writes its row and sends `Accepted`.
    Normal,
    /// Writes and sends, then fails on its first attempt.
    FailFirst,
    /// On its first attempt, runs a failing statement, ignores the error and returns
    /// success (the transaction is aborted).
    SwallowFirst,
    /// Writes its row, then waits for a permit of the script's gate.
    Hang,
    /// Writes its row and deletes the queue `accepted` (if it is there), from another
    /// connection; sends nothing.
    DeleteAccepted,
    /// Writes its row and sends `Accepted` with a header whose value holds a NUL
    /// character, which Postgres cannot store.
    SendNul,
}

#[derive(Clone)]
struct Script {
    acts: Arc<BTreeMap<String, Act>>,
    /// Whether handlers send `Accepted`.
    quiet: bool,
    /// Calls per order id.
    calls: Arc<Mutex<BTreeMap<String, u32>>>,
    gate: Arc<tokio::sync::Semaphore>,
    transport: Arc<dyn courier::Transport>,
}

impl Script {
    fn calls(&self, id: &str) -> u32 {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    fn total_calls(&self) -> u32 {
        self.calls.lock().unwrap().values().sum()
    }
}

#[courier::handler]
async fn take(order: Order, ctx: &mut Context) -> Result<(), HandlerError> {
    let script = ctx.state::<Script>()?.clone();
    *script.calls.lock().unwrap().entry(order.id.clone()).or_default() += 1;
    let act = script.acts.get(&order.id).copied().unwrap_or(Act::Normal);
    let first = ctx.attempt() == 1;
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO orders (id, tx) VALUES ($1, txid_current())")
        .bind(&order.id)
        .execute(&mut *tx)
        .await?;
    if act == Act::SwallowFirst && first {
        let failed = sqlx::query("SELECT 1 / 0").execute(&mut *tx).await;
        assert!(failed.is_err(), "the statement fails");
    }
    if act == Act::DeleteAccepted {
        match script.transport.delete(&EntityPath::queue("accepted")).await {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), courier::ErrorKind::EntityNotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(());
    }
    if act == Act::SendNul {
        let mut options = courier::SendOptions::default();
        options
            .headers
            .insert("note".to_owned(), courier::PropertyValue::from("a\0b"));
        ctx.send_with(&Accepted { id: order.id.clone() }, options)?;
        return Ok(());
    }
    if !script.quiet {
        ctx.send(&Accepted { id: order.id.clone() })?;
    }
    if act == Act::FailFirst && first {
        return Err(HandlerError::msg("fails after writing and sending"));
    }
    if act == Act::Hang {
        script.gate.acquire().await?.forget();
    }
    Ok(())
}

struct Env {
    env: StoreEnv,
    script: Script,
}

impl Env {
    async fn new(kind: StoreKind, acts: &[(&str, Act)], quiet: bool) -> Self {
        let env = StoreEnv::new(kind).await;
        env.exec("CREATE TABLE orders (id TEXT NOT NULL, tx BIGINT NOT NULL)")
            .await;
        for q in ["orders", "accepted"] {
            env.fx
                .transport
                .create_queue(q, &QueueOptions::default())
                .await
                .unwrap();
        }
        let script = Script {
            acts: Arc::new(acts.iter().map(|(id, act)| ((*id).to_owned(), *act)).collect()),
            quiet,
            calls: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            transport: env.fx.transport.clone(),
        };
        Self { env, script }
    }

    /// The endpoint with `group_commit(group)` and twice as many handlers (a group takes
    /// at most half of them).
    fn endpoint(&self, group: usize) -> EndpointBuilder {
        self.endpoint_with(group, 2 * group)
    }

    fn endpoint_with(&self, group: usize, concurrency: usize) -> EndpointBuilder {
        let clock: Arc<dyn Clock> = Arc::new(self.env.fx.clock.clone());
        Endpoint::builder("orders")
            .transport(self.env.fx.transport.clone())
            .clock(clock)
            .routes(Routes::new().send::<Accepted>("accepted"))
            .store(self.env.store.clone())
            .state(self.script.clone())
            .concurrency(concurrency)
            .group_commit(group)
            .handler(take)
    }

    /// Sends orders with message ids `m-<order id>`, in one batch, before the endpoint
    /// starts, so that its first receive takes them together.
    async fn send(&self, ids: &[&str]) {
        let batch = ids
            .iter()
            .map(|id| {
                Order { id: (*id).to_owned() }
                    .to_envelope()
                    .unwrap()
                    .with_message_id(format!("m-{id}"))
            })
            .collect();
        self.send_envelopes(batch).await;
    }

    async fn send_envelopes(&self, batch: Vec<Envelope>) {
        let sender = self
            .env
            .fx
            .transport
            .sender("orders", SenderOptions::default())
            .await
            .unwrap();
        sender.send_batch(batch).await.unwrap();
    }

    /// Order id -> the transaction ids of its rows.
    async fn rows(&self) -> BTreeMap<String, Vec<i64>> {
        let rows: Vec<(String, i64)> = sqlx::query_as("SELECT id, tx FROM orders ORDER BY id")
            .fetch_all(self.env.pg())
            .await
            .unwrap();
        let mut by_id: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (id, tx) in rows {
            by_id.entry(id).or_default().push(tx);
        }
        by_id
    }

    async fn accepted(&self) -> Vec<String> {
        let mut ids = self.env.queued_ids("accepted").await;
        ids.sort();
        ids
    }

    async fn inbox(&self) -> BTreeSet<String> {
        let ids: Vec<String> = sqlx::query_scalar("SELECT message_id FROM courier.inbox")
            .fetch_all(self.env.pg())
            .await
            .unwrap();
        ids.into_iter().collect()
    }

    async fn outbox(&self) -> i64 {
        self.env.count("SELECT COUNT(*) FROM courier.outbox").await
    }

    async fn left_in_queue(&self) -> u64 {
        let c = self
            .env
            .fx
            .transport
            .counts(&EntityPath::queue("orders"))
            .await
            .unwrap();
        c.active + c.scheduled
    }
}

/// Waits until `n` messages were completed and the queue is empty.
async fn drained(env: &Env, running: &courier::RunningEndpoint, n: u64) {
    eventually("every message completed", || async {
        running.stats().completed >= n && env.left_in_queue().await == 0
    })
    .await;
}

fn ids(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| format!("m-{s}")).collect()
}

/// Eight orders, eight handlers, groups of four: two transactions or more, every effect
/// once.
async fn members_commit_together(kind: StoreKind) {
    let env = Env::new(kind, &[], false).await;
    let all = ["1", "2", "3", "4", "5", "6", "7", "8"];
    env.send(&all).await;
    let running = env.endpoint(4).start().await.unwrap();
    drained(&env, &running, 8).await;
    running.shutdown().await.unwrap();

    let rows = env.rows().await;
    assert_eq!(rows.len(), 8);
    assert!(rows.values().all(|t| t.len() == 1), "one row each: {rows:?}");
    let txs: BTreeSet<i64> = rows.values().flatten().copied().collect();
    assert!(txs.len() < 8, "handlings shared transactions: {rows:?}");
    assert!(txs.len() >= 2, "no group is larger than four: {rows:?}");
    let accepted = env.accepted().await;
    assert_eq!(accepted.len(), 8);
    assert_eq!(accepted.iter().collect::<BTreeSet<_>>().len(), 8, "no copy was sent");
    assert_eq!(env.inbox().await, ids(&all));
    eventually("the outbox emptied", || async { env.outbox().await == 0 }).await;
    env.env.finish().await;
}

/// A group takes at most half the handlers, so that two groups overlap: four orders
/// received together, four handlers and `group_commit(4)` commit in groups of two (one
/// group of four before the cap: it left the server idle while it ran).
async fn a_group_takes_at_most_half_the_handlers(kind: StoreKind) {
    let env = Env::new(kind, &[], false).await;
    let all = ["1", "2", "3", "4"];
    env.send(&all).await;
    let running = env.endpoint_with(4, 4).start().await.unwrap();
    drained(&env, &running, 4).await;
    running.shutdown().await.unwrap();

    let rows = env.rows().await;
    assert_eq!(rows.len(), 4);
    let mut members: BTreeMap<i64, usize> = BTreeMap::new();
    for tx in rows.values().flatten() {
        *members.entry(*tx).or_default() += 1;
    }
    assert!(
        members.values().all(|&n| n <= 2),
        "no group is larger than two: {rows:?}"
    );
    assert!(
        members.values().any(|&n| n == 2),
        "handlings still shared transactions: {rows:?}"
    );
    assert_eq!(env.inbox().await, ids(&all));
    env.env.finish().await;
}

/// A group's outbox rows are stamped by the endpoint's clock, as a message's alone (the
/// outbox sweeper compares them with that clock). Regression: the group used the wall
/// clock.
async fn outbox_rows_of_a_group_carry_the_endpoint_clock(kind: StoreKind) {
    let env = Env::new(kind, &[], false).await;
    for sql in [
        "CREATE TABLE stamps (created_at TIMESTAMPTZ NOT NULL)",
        "CREATE FUNCTION keep_stamp() RETURNS trigger AS \
         $$ BEGIN INSERT INTO stamps VALUES (NEW.created_at); RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER keep_stamp AFTER INSERT ON courier.outbox FOR EACH ROW EXECUTE FUNCTION keep_stamp()",
    ] {
        env.env.exec(sql).await;
    }
    env.env.fx.clock.advance(std::time::Duration::from_secs(30 * 24 * 3600));
    let all = ["1", "2", "3", "4"];
    env.send(&all).await;
    let running = env.endpoint(4).start().await.unwrap();
    drained(&env, &running, 4).await;
    running.shutdown().await.unwrap();
    let stamps: Vec<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar("SELECT created_at FROM stamps")
        .fetch_all(env.env.pg())
        .await
        .unwrap();
    assert_eq!(stamps.len(), 4);
    let now = env.env.fx.clock.now();
    assert!(
        stamps.iter().all(|t| (now - *t).num_seconds().abs() < 1),
        "stamped {stamps:?}, the endpoint's clock reads {now}"
    );
    env.env.finish().await;
}

/// A member fails after writing and sending: it is rolled back alone (to its savepoint),
/// the other three commit together, and its retry commits it once.
async fn a_failing_member_is_rolled_back_alone(kind: StoreKind) {
    let env = Env::new(kind, &[("2", Act::FailFirst)], false).await;
    env.send(&["1", "2", "3", "4"]).await;
    let running = env.endpoint(4).start().await.unwrap();
    drained(&env, &running, 4).await;
    let stats = running.stats();
    running.shutdown().await.unwrap();

    assert_eq!(stats.retried, 1);
    assert_eq!(env.script.calls("2"), 2);
    assert_eq!(env.script.total_calls(), 5);
    let rows = env.rows().await;
    assert!(rows.values().all(|t| t.len() == 1), "one row each: {rows:?}");
    let others: BTreeSet<i64> = ["1", "3", "4"].iter().map(|id| rows[*id][0]).collect();
    assert_eq!(others.len(), 1, "the other three committed together: {rows:?}");
    assert!(!others.contains(&rows["2"][0]), "the retry committed later: {rows:?}");
    assert_eq!(
        env.accepted().await.len(),
        4,
        "the failed attempt's message was not sent"
    );
    assert_eq!(env.inbox().await, ids(&["1", "2", "3", "4"]));
    env.env.finish().await;
}

/// Handlers swallow a failed statement and return success, which aborts the shared
/// transaction. Each such member is found by the next statement after it (the next
/// member's savepoint, or the group's own statements before COMMIT), rolled back to its
/// savepoint and retried; the others commit; nothing is lost.
async fn swallowed_failures(kind: StoreKind, culprits: &[&str], quiet: bool) {
    let acts: Vec<(&str, Act)> = culprits.iter().map(|c| (*c, Act::SwallowFirst)).collect();
    let env = Env::new(kind, &acts, quiet).await;
    let all = ["1", "2", "3", "4"];
    env.send(&all).await;
    let running = env.endpoint(4).start().await.unwrap();
    drained(&env, &running, 4).await;
    let stats = running.stats();
    running.shutdown().await.unwrap();

    for c in culprits {
        assert_eq!(env.script.calls(c), 2, "{c} retried");
    }
    let n = u32::try_from(culprits.len()).unwrap();
    assert_eq!(env.script.total_calls(), 4 + n);
    assert_eq!(stats.retried, u64::from(n), "only they were retried");
    let rows = env.rows().await;
    assert_eq!(rows.len(), 4, "every order committed: {rows:?}");
    assert!(rows.values().all(|t| t.len() == 1), "once: {rows:?}");
    if !quiet {
        assert_eq!(env.accepted().await.len(), 4);
    }
    assert_eq!(env.inbox().await, ids(&all));
    env.env.finish().await;
}

/// The culprit is followed by another member, whose savepoint finds it.
async fn a_swallowed_failure_is_found_by_the_next_member(kind: StoreKind) {
    swallowed_failures(kind, &["2"], false).await;
}

/// The culprit is the last member (members take turns in the order received): the
/// group's outbox statement finds it.
async fn a_swallowed_failure_in_the_last_member_is_found(kind: StoreKind) {
    swallowed_failures(kind, &["4"], false).await;
}

/// No member sends anything, so no outbox statement follows the last one: the group
/// checks the transaction itself before its COMMIT.
async fn a_swallowed_failure_without_outgoing_messages_is_found(kind: StoreKind) {
    swallowed_failures(kind, &["4"], true).await;
}

/// Every member is a culprit.
async fn every_swallowed_failure_is_found(kind: StoreKind) {
    swallowed_failures(kind, &["1", "2", "3", "4"], false).await;
}

/// Regression: alone (no group), a handler that swallowed a failed statement and sent
/// nothing had its COMMIT silently turned into a rollback, and the message was completed
/// with none of its effects. It now fails and is retried.
async fn alone_a_swallowed_failure_is_retried_not_lost(kind: StoreKind) {
    let env = Env::new(kind, &[("1", Act::SwallowFirst)], true).await;
    env.send(&["1"]).await;
    let running = env.endpoint(1).start().await.unwrap();
    drained(&env, &running, 1).await;
    running.shutdown().await.unwrap();
    assert_eq!(env.script.calls("1"), 2, "retried");
    let rows = env.rows().await;
    assert_eq!(rows.get("1").map(Vec::len), Some(1), "committed once: {rows:?}");
    env.env.finish().await;
}

/// With a history, the handled event's statement is the check that the handler did not
/// leave its transaction aborted (the `SELECT 1` before the COMMIT is saved): a handler
/// that swallowed a failed statement and sent nothing is retried, not completed without
/// its effects, and its history says why.
async fn with_a_history_a_swallowed_failure_is_retried_not_lost(kind: StoreKind) {
    let env = Env::new(kind, &[("1", Act::SwallowFirst)], true).await;
    env.send(&["1"]).await;
    let running = env
        .endpoint(1)
        .history(courier::HistoryOptions::new())
        .start()
        .await
        .unwrap();
    drained(&env, &running, 1).await;
    running.shutdown().await.unwrap();
    assert_eq!(env.script.calls("1"), 2, "retried");
    let rows = env.rows().await;
    assert_eq!(rows.get("1").map(Vec::len), Some(1), "committed once: {rows:?}");
    let events: Vec<(String, i32, Option<String>)> = sqlx::query_as(
        "SELECT kind, attempt, detail->>'error' FROM courier.history WHERE message_id = 'm-1' ORDER BY id",
    )
    .fetch_all(env.env.pg())
    .await
    .unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!((events[0].0.as_str(), events[0].1), ("retried", 1), "{events:?}");
    assert!(
        events[0]
            .2
            .as_deref()
            .is_some_and(|e| e.contains("its error was not returned")),
        "the retried event says what the handler did: {events:?}"
    );
    assert_eq!((events[1].0.as_str(), events[1].1), ("handled", 2), "{events:?}");
    env.env.finish().await;
}

/// With a history, a group's handled events are written in the statement of the group's
/// outgoing messages (and a handling alone's with its own): each event commits with the
/// messages it says were sent.
async fn with_a_history_events_commit_with_what_they_sent(kind: StoreKind) {
    let env = Env::new(kind, &[], false).await;
    let all = ["1", "2", "3", "4", "5"];
    env.send(&all).await;
    let running = env
        .endpoint(4)
        .history(courier::HistoryOptions::new())
        .start()
        .await
        .unwrap();
    drained(&env, &running, 5).await;
    running.shutdown().await.unwrap();
    eventually("every message sent", || async { env.accepted().await.len() == 5 }).await;
    let sent: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT message_id, detail -> 'sent' -> 0 ->> 'message_id' FROM courier.history \
         WHERE kind = 'handled' ORDER BY message_id",
    )
    .fetch_all(env.env.pg())
    .await
    .unwrap();
    assert_eq!(
        sent.iter().map(|(m, _)| m.clone()).collect::<BTreeSet<_>>(),
        ids(&all),
        "one handled event per message: {sent:?}"
    );
    let mut named: Vec<String> = sent.into_iter().filter_map(|(_, s)| s).collect();
    named.sort();
    assert_eq!(named, env.accepted().await, "each event names the message it sent");
    env.env.finish().await;
}

/// A message the endpoint cannot handle (unknown type) leaves its group before the
/// store: it is dead-lettered, and the inbox record the group made for it is deleted,
/// so a corrected copy with the same id would be handled.
async fn a_member_that_leaves_keeps_no_inbox_record(kind: StoreKind) {
    let env = Env::new(kind, &[], false).await;
    let order = |id: &str| {
        Order { id: id.to_owned() }
            .to_envelope()
            .unwrap()
            .with_message_id(format!("m-{id}"))
    };
    let mut stray = Envelope::new("{}").with_message_id("m-stray");
    stray.message_type = Some("group.Nobody".into());
    env.send_envelopes(vec![order("1"), stray, order("2"), order("3")])
        .await;
    let running = env.endpoint(4).start().await.unwrap();
    eventually("three completed, one dead-lettered", || async {
        let s = running.stats();
        s.completed == 3 && s.dead_lettered == 1
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(env.inbox().await, ids(&["1", "2", "3"]));
    assert_eq!(env.rows().await.len(), 3);
    let dead = env
        .env
        .fx
        .transport
        .peek(&EntityPath::queue("orders").dead_letter(), 0, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].envelope.message_id, "m-stray");
    env.env.finish().await;
}

/// A message already processed (its id in the inbox) arrives in a group: it is completed
/// without its handler, and the others are handled.
async fn a_duplicate_in_a_group_is_not_handled_again(kind: StoreKind) {
    let env = Env::new(kind, &[], false).await;
    let now = env.env.fx.clock.now();
    match env.env.store.begin("orders", "m-2", None, now).await.unwrap() {
        courier::Begin::Fresh(work) => drop(work.commit().await.unwrap()),
        courier::Begin::Duplicate(_) => panic!("a fresh id"),
    }
    env.send(&["1", "2", "3", "4"]).await;
    let running = env.endpoint(4).start().await.unwrap();
    drained(&env, &running, 4).await;
    let stats = running.stats();
    running.shutdown().await.unwrap();
    assert_eq!(stats.duplicates, 1);
    assert_eq!(env.script.calls("2"), 0);
    assert_eq!(env.script.total_calls(), 3);
    assert_eq!(env.rows().await.len(), 3);
    assert_eq!(env.accepted().await.len(), 3);
    env.env.finish().await;
}

/// A group's row locks last until the group commits: a message of a second instance that
/// needs the same id waits for it and then sees a duplicate. Both instances run groups.
async fn two_grouping_instances_share_the_work_once(kind: StoreKind) {
    let env = Env::new(kind, &[], false).await;
    let all: Vec<String> = (1..=40).map(|i| i.to_string()).collect();
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    env.send(&refs).await;
    let a = env.endpoint(4).start().await.unwrap();
    let b = env.endpoint(3).start().await.unwrap();
    eventually("every message completed", || async {
        a.stats().completed + b.stats().completed >= 40 && env.left_in_queue().await == 0
    })
    .await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    let rows = env.rows().await;
    assert_eq!(rows.len(), 40);
    assert!(rows.values().all(|t| t.len() == 1), "once each: {rows:?}");
    assert_eq!(env.accepted().await.len(), 40);
    assert_eq!(env.script.total_calls(), 40);
    env.env.finish().await;
}

/// The shutdown deadline passes while one member's handler hangs and the next waits for
/// its turn: both are stopped, and the group's transaction does not stay open. Nothing is
/// left locked, so after a restart both messages are done, each once.
async fn a_hard_stop_leaves_no_transaction_open(kind: StoreKind) {
    let env = Env::new(kind, &[("1", Act::Hang)], false).await;
    env.send(&["1", "2"]).await;
    let running = env
        .endpoint(2)
        .shutdown_timeout(std::time::Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    eventually("the first handler hangs", || async { env.script.calls("1") == 1 }).await;
    let report = running.shutdown().await.unwrap();
    assert_eq!(report.interrupted, 2, "{report}");
    let open = "SELECT COUNT(*) FROM pg_stat_activity \
                WHERE datname = current_database() AND state LIKE 'idle in transaction%'";
    eventually("no transaction left open", || async { env.env.count(open).await == 0 }).await;
    // The second member may have had its turn between the first one's stop and its own,
    // and committed: its redelivery is then a duplicate. Either way, once each below.

    env.script.gate.add_permits(10);
    env.env.fx.lose_locks().await;
    let running = env.endpoint(2).start().await.unwrap();
    drained(&env, &running, 2).await;
    running.shutdown().await.unwrap();
    let rows = env.rows().await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.values().all(|t| t.len() == 1), "once each: {rows:?}");
    assert_eq!(env.inbox().await, ids(&["1", "2"]));
    env.env.finish().await;
}

/// A member's lock goes stale while its handler runs (another process locked its message
/// again: the delivery count moved on). On the Postgres transport's own store its
/// completion is part of the group's transaction and fenced by the lock token: its write
/// and its send are rolled back to its savepoint, and the other members commit together
/// all the same. Elsewhere (an outbox store) it commits with the group, and its
/// redelivery is recognised as a duplicate. Either way, every effect once.
async fn a_member_whose_lock_went_stale_does_not_poison_the_group(kind: StoreKind) {
    let env = Env::new(kind, &[("2", Act::Hang)], false).await;
    env.send(&["1", "2", "3", "4"]).await;
    let running = env.endpoint(4).start().await.unwrap();
    eventually("the second member hangs", || async { env.script.calls("2") == 1 }).await;
    let stolen = sqlx::query("UPDATE courier.message SET delivery_count = delivery_count + 1 WHERE message_id = 'm-2'")
        .execute(env.env.pg())
        .await
        .unwrap();
    assert_eq!(stolen.rows_affected(), 1);
    env.script.gate.add_permits(10);
    eventually("the first group ended", || async {
        running.stats().completed >= 3 && running.stats().running == 0
    })
    .await;
    // The stale member's message comes back once its (stolen) lock expires.
    env.env.fx.clock.advance(std::time::Duration::from_secs(61));
    drained(&env, &running, 4).await;
    let stats = running.stats();
    running.shutdown().await.unwrap();

    let rows = env.rows().await;
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(rows.values().all(|t| t.len() == 1), "once each: {rows:?}");
    let others: BTreeSet<i64> = ["1", "3", "4"].iter().map(|id| rows[*id][0]).collect();
    assert_eq!(others.len(), 1, "the other three committed together: {rows:?}");
    assert_eq!(env.accepted().await.len(), 4, "every message sent once");
    assert_eq!(env.inbox().await, ids(&["1", "2", "3", "4"]));
    if kind.one_transaction() {
        assert_eq!(env.script.calls("2"), 2, "handled again after its rollback");
        assert!(!others.contains(&rows["2"][0]), "its retry committed later: {rows:?}");
        assert_eq!(stats.duplicates, 0);
    } else {
        assert_eq!(stats.duplicates, 1, "its redelivery found in the inbox");
    }
    let dead = env.env.fx.transport.counts(&EntityPath::queue("orders")).await.unwrap();
    assert_eq!(dead.dead_lettered, 0);
    env.env.finish().await;
}

/// Every scenario on the Postgres store beside the transport and on the Postgres
/// transport's own store (group commit in the one transaction).
macro_rules! on_both_stores {
    ($($scenario:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(courier_tests::stores::StoreKind::Postgres).await;
                }
            )*
        }
        mod pg_transport {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(courier_tests::stores::StoreKind::PgTransport).await;
                }
            )*
        }
    };
}

on_both_stores!(
    members_commit_together,
    a_group_takes_at_most_half_the_handlers,
    a_failing_member_is_rolled_back_alone,
    a_swallowed_failure_is_found_by_the_next_member,
    a_swallowed_failure_in_the_last_member_is_found,
    a_swallowed_failure_without_outgoing_messages_is_found,
    every_swallowed_failure_is_found,
    alone_a_swallowed_failure_is_retried_not_lost,
    with_a_history_a_swallowed_failure_is_retried_not_lost,
    with_a_history_events_commit_with_what_they_sent,
    a_member_that_leaves_keeps_no_inbox_record,
    a_duplicate_in_a_group_is_not_handled_again,
    two_grouping_instances_share_the_work_once,
    a_hard_stop_leaves_no_transaction_open,
);

/// On the Postgres transport (its lock tokens are rows the test can move on), with its
/// own store and with a `PostgresStore` beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lock_went_stale_does_not_poison_the_group_in_one_transaction() {
    a_member_whose_lock_went_stale_does_not_poison_the_group(StoreKind::PgTransport).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lock_went_stale_does_not_poison_the_group_with_an_outbox() {
    a_member_whose_lock_went_stale_does_not_poison_the_group(StoreKind::PgTransportOutbox).await;
}

/// Outbox rows exist only beside a transport (the transport's own store sends in the
/// transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_rows_of_a_group_carry_the_endpoint_clock_on_postgres() {
    outbox_rows_of_a_group_carry_the_endpoint_clock(StoreKind::Postgres).await;
}
