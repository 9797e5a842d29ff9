//! What a group's commit can meet on its way: on the transport's own store, its members'
//! sends go into their queues at its commit, one statement per queue, so the order of
//! those sends and a queue deleted between a member's turn and the commit are tested
//! here; and on both stores, values Postgres cannot store (a NUL character in a header
//! sent, or in a received message's id) fail their own member or handling, never the
//! group.

use std::collections::BTreeSet;

use courier::{
    Context, Endpoint, EntityPath, Envelope, HandlerError, Message, RetryPolicy, Routes, SubscriptionOptions,
    TopicOptions,
};
use courier_tests::eventually;
use courier_tests::stores::StoreKind;
use serde::{Deserialize, Serialize};

use super::{Accepted, Act, Env, drained, ids};

/// On the transport's own store, a group's sends go into their queues at its commit, every
/// member's to one queue in one statement: each once, and within a group in the order
/// the members took their turns (the order received). Groups overlap, so two groups'
/// messages may interleave in the queue as two handlings' do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_sends_keep_the_members_order_in_one_transaction() {
    let env = Env::new(StoreKind::PgTransport, &[], false).await;
    let all = ["1", "2", "3", "4", "5", "6", "7", "8"];
    env.send(&all).await;
    let running = env.endpoint(4).start().await.unwrap();
    drained(&env, &running, 8).await;
    running.shutdown().await.unwrap();
    let rows = env.rows().await;
    assert!(rows.values().all(|t| t.len() == 1), "one row each: {rows:?}");
    // The order ids of the `Accepted` messages, peeked in sequence order.
    let mut sent = Vec::new();
    for m in env
        .env
        .fx
        .transport
        .peek(&EntityPath::queue("accepted"), 0, 100)
        .await
        .unwrap()
    {
        let a: Accepted = serde_json::from_slice(&m.envelope.body).unwrap();
        sent.push(a.id);
    }
    assert_eq!(sent.iter().collect::<BTreeSet<_>>().len(), 8, "each once: {sent:?}");
    let txs: BTreeSet<i64> = rows.values().flatten().copied().collect();
    assert!(txs.len() < 8, "handlings shared transactions: {rows:?}");
    for tx in txs {
        let of_group: Vec<&String> = sent.iter().filter(|id| rows[id.as_str()][0] == tx).collect();
        let mut in_turns = of_group.clone();
        in_turns.sort();
        assert_eq!(
            of_group, in_turns,
            "a group's sends in its members' order: {sent:?} {rows:?}"
        );
    }
    env.env.finish().await;
}

/// On the transport's own store, a queue a member sent to is deleted (by another member,
/// from another connection) after that member's turn and before the group commits: the
/// group's insert finds no queue, the whole group rolls back with a transient error, and
/// each member is retried. The one that sent to the deleted queue then fails alone at its
/// turn (dead-lettered: the queue does not exist) with none of its effects; the other
/// commits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_while_its_group_commits_fails_the_group_and_each_member_is_retried() {
    let env = Env::new(StoreKind::PgTransport, &[("2", Act::DeleteAccepted)], false).await;
    env.send(&["1", "2"]).await;
    let running = env
        .endpoint(2)
        .recoverability(courier::RetryPolicy::none().immediate(2))
        .start()
        .await
        .unwrap();
    eventually("the first member dead-lettered", || async {
        env.env
            .fx
            .transport
            .counts(&EntityPath::queue("orders"))
            .await
            .unwrap()
            .dead_lettered
            == 1
    })
    .await;
    drained(&env, &running, 1).await;
    running.shutdown().await.unwrap();
    let rows = env.rows().await;
    assert_eq!(
        rows.keys().collect::<Vec<_>>(),
        ["2"],
        "the sender's write rolled back: {rows:?}"
    );
    assert_eq!(rows["2"].len(), 1, "once: {rows:?}");
    assert_eq!(env.inbox().await, ids(&["2"]));
    assert!(
        env.script.calls("1") >= 2,
        "the sender was retried after the group failed"
    );
    assert!(env.script.calls("2") >= 2, "the other member was retried with it");
    let dead = dead_letters(&env).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].envelope.message_id, "m-1");
    let open = "SELECT COUNT(*) FROM pg_stat_activity \
                WHERE datname = current_database() AND state LIKE 'idle in transaction%'";
    eventually("no transaction left open", || async { env.env.count(open).await == 0 }).await;
    env.env.finish().await;
}

/// The dead letters of the queue `orders`.
async fn dead_letters(env: &Env) -> Vec<courier::ReceivedMessage> {
    env.env
        .fx
        .transport
        .peek(&EntityPath::queue("orders").dead_letter(), 0, 10)
        .await
        .unwrap()
}

/// Runs the endpoint with groups of up to 4 and no retries until one message is
/// dead-lettered and three are completed, then stops it.
async fn one_dead_lettered_three_completed(env: &Env) {
    let running = env
        .endpoint(4)
        .recoverability(RetryPolicy::none())
        .start()
        .await
        .unwrap();
    eventually("every message settled", || async {
        let c = env.env.fx.transport.counts(&EntityPath::queue("orders")).await.unwrap();
        c.dead_lettered == 1 && c.active == 0 && running.stats().completed == 3
    })
    .await;
    running.shutdown().await.unwrap();
}

/// A member sends a message with a header Postgres cannot store (a NUL character). On the
/// transport's own store the transport refuses it at `send_with`; with an outbox the
/// store refuses it at the member's turn. Either way that member alone is dead-lettered
/// with the reason, and the others commit at their first attempt. Regression: with an
/// outbox, the group's one outbox statement failed at its commit (SQLSTATE 22P05), and
/// every member with it.
async fn a_message_postgres_cannot_store_fails_its_member_alone(kind: StoreKind) {
    let env = Env::new(kind, &[("2", Act::SendNul)], false).await;
    env.send(&["1", "2", "3", "4"]).await;
    one_dead_lettered_three_completed(&env).await;
    let rows = env.rows().await;
    assert_eq!(
        rows.keys().map(String::as_str).collect::<Vec<_>>(),
        ["1", "3", "4"],
        "the refused member's write rolled back: {rows:?}"
    );
    for id in ["1", "3", "4"] {
        assert_eq!(env.script.calls(id), 1, "order {id} committed at its first attempt");
    }
    assert_eq!(env.accepted().await.len(), 3, "the others' messages sent once each");
    let dead = dead_letters(&env).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].envelope.message_id, "m-2");
    let description = dead[0].broker.dead_letter_description.clone().unwrap_or_default();
    assert!(description.contains("NUL"), "the dead letter says why: {description}");
    env.env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_postgres_cannot_store_fails_its_member_alone_with_an_outbox() {
    a_message_postgres_cannot_store_fails_its_member_alone(StoreKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_postgres_cannot_store_fails_its_member_alone_in_one_transaction() {
    a_message_postgres_cannot_store_fails_its_member_alone(StoreKind::PgTransport).await;
}

/// A received message whose id holds a NUL character (a RabbitMQ producer may send one;
/// here the in-memory broker carries it) cannot be recorded in a Postgres inbox. It is
/// handled alone, so it fails alone; the messages received with it form their group and
/// commit at their first attempt. Regression: it was grouped, and the group's one inbox
/// statement failed (SQLSTATE 22021) for every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_received_id_the_inbox_cannot_record_is_handled_alone() {
    let env = Env::new(StoreKind::Postgres, &[], false).await;
    let batch: Vec<Envelope> = ["1", "2", "3", "4"]
        .iter()
        .map(|id| {
            let message_id = if *id == "2" {
                "m-\0-2".to_owned()
            } else {
                format!("m-{id}")
            };
            super::Order { id: (*id).to_owned() }
                .to_envelope()
                .unwrap()
                .with_message_id(message_id)
        })
        .collect();
    env.send_envelopes(batch).await;
    one_dead_lettered_three_completed(&env).await;
    for id in ["1", "3", "4"] {
        assert_eq!(env.script.calls(id), 1, "order {id} committed at its first attempt");
    }
    let rows = env.rows().await;
    assert_eq!(
        rows.keys().map(String::as_str).collect::<Vec<_>>(),
        ["1", "3", "4"],
        "{rows:?}"
    );
    assert_eq!(env.inbox().await, ids(&["1", "3", "4"]));
    let txs: BTreeSet<i64> = ["1", "3", "4"].iter().map(|id| rows[*id][0]).collect();
    assert!(txs.len() < 3, "the others were grouped: {rows:?}");
    env.env.finish().await;
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "group.Announced")]
struct Announced {
    id: String,
}

#[courier::handler]
async fn announce(order: super::Order, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.publish(&Announced { id: order.id })?;
    Ok(())
}

/// On the transport's own store, the members' publishes to a topic go in at the group's
/// commit too, one statement fanning them out: the subscription gets each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_publishes_reach_the_subscription_once_each() {
    let env = Env::new(StoreKind::PgTransport, &[], false).await;
    let t = env.env.fx.transport.clone();
    t.create_topic("announced", &TopicOptions::default()).await.unwrap();
    t.create_subscription("announced", "audit", &SubscriptionOptions::default())
        .await
        .unwrap();
    let all = ["1", "2", "3", "4", "5", "6", "7", "8"];
    env.send(&all).await;
    let running = Endpoint::builder("orders")
        .transport(t.clone())
        .store(env.env.store.clone())
        .routes(Routes::new().event_on::<Announced>("announced"))
        .concurrency(8)
        .group_commit(4)
        .handler(announce)
        .start()
        .await
        .unwrap();
    drained(&env, &running, 8).await;
    running.shutdown().await.unwrap();
    let mut announced = Vec::new();
    for m in t
        .peek(&EntityPath::subscription("announced", "audit"), 0, 100)
        .await
        .unwrap()
    {
        let a: Announced = serde_json::from_slice(&m.envelope.body).unwrap();
        announced.push(a.id);
    }
    announced.sort();
    assert_eq!(announced, all, "each event once");
    assert_eq!(env.inbox().await, ids(&all));
    env.env.finish().await;
}
