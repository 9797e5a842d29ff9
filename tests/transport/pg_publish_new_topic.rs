//! Publishing an event whose topic does not exist yet, on the Postgres transport with its
//! own store (issue 30, bug 6): the store inserts what a handler published in the
//! handling's transaction, and used to fail the handling ("the store failed; the
//! handler's transaction was rolled back: ... does not exist"), so the message was
//! retried and dead-lettered and a saga that published such an event never completed.
//! The store now creates the topic in the transaction, as the transport's sender does
//! (and the embedded broker and RabbitMQ): a topic without subscriptions keeps no copy.
//! A command to a queue that does not exist stays an error.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use courier::saga::SagaContext;
use courier::{
    Context, Endpoint, EntityPath, HandlerError, PostgresTransport, RetryPolicy, Routes, RunningEndpoint, Transport,
    VirtualClock,
};
use courier_tests::eventually;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// A command whose handler publishes `Announced`.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgnewtopic.Announce")]
struct Announce {
    n: i64,
}

/// An event nobody subscribes to: its topic does not exist until it is published.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgnewtopic.Announced")]
struct Announced {
    n: i64,
}

/// How many times the handler ran.
#[derive(Clone, Default)]
struct Calls(Arc<AtomicU32>);

#[courier::handler]
async fn announce(m: Announce, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.state::<Calls>()?.0.fetch_add(1, Ordering::SeqCst);
    ctx.publish(&Announced { n: m.n })?;
    Ok(())
}

/// A pool of its own on the process's transport database, to look at its tables.
async fn pool() -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(courier_tests::pg_transport::database().await)
        .await
        .unwrap()
}

async fn topic_exists(pool: &PgPool, topic: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM courier.entity WHERE parent = 0 AND name = $1 AND kind = 1)")
        .bind(topic)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Waits until the endpoint's queue holds nothing to handle (every message completed or
/// dead-lettered), then says how many were dead-lettered.
async fn settled(transport: &PostgresTransport, queue: &str) -> u64 {
    let path = EntityPath::queue(queue);
    eventually("the queue's messages handled or dead-lettered", || async {
        let c = transport.counts(&path).await.unwrap();
        c.active == 0 && c.scheduled == 0
    })
    .await;
    transport.counts(&path).await.unwrap().dead_lettered
}

async fn start(transport: &PostgresTransport, queue: &str, routes: Routes, calls: &Calls) -> RunningEndpoint {
    Endpoint::builder(queue)
        .transport(Arc::new(transport.clone()))
        .store(transport.store())
        .routes(routes)
        .handler(announce)
        .state(calls.clone())
        // Any failure dead-letters at once: the test sees it without waiting for retries.
        .recoverability(RetryPolicy::none())
        .start()
        .await
        .unwrap()
}

/// A handler publishes an event of a topic that does not exist: handled once, completed,
/// not dead-lettered; the topic exists afterwards and, with no subscription, holds no
/// message. Failed on the store before: dead-lettered with "... does not exist".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_publishing_to_a_topic_that_does_not_exist_completes() {
    let clock = VirtualClock::starting_now();
    let transport = courier_tests::pg_transport::transport(&clock).await;
    let pool = pool().await;
    let topic = "pgnewtopic.Announced";
    assert!(!topic_exists(&pool, topic).await, "no topic before the test");

    let calls = Calls::default();
    let routes = Routes::new()
        .send::<Announce>("pgnewtopic-announcer")
        .event::<Announced>();
    let endpoint = start(&transport, "pgnewtopic-announcer", routes, &calls).await;
    assert!(
        !topic_exists(&pool, topic).await,
        "the endpoint does not create the topic of an event it only publishes"
    );

    endpoint.bus().send(&Announce { n: 1 }).await.unwrap();
    let dead = settled(&transport, "pgnewtopic-announcer").await;
    assert_eq!(dead, 0, "the handling was not dead-lettered");
    assert_eq!(calls.0.load(Ordering::SeqCst), 1, "handled once");
    assert!(topic_exists(&pool, topic).await, "the publish created the topic");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM courier.message m JOIN courier.entity e ON e.id = m.entity_id \
         WHERE e.name = $1 OR e.parent = (SELECT id FROM courier.entity WHERE parent = 0 AND name = $1)",
    )
    .bind(topic)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(held, 0, "a topic without subscriptions keeps no copy");

    // Now that it exists, the next publishes go the usual way.
    endpoint.bus().send(&Announce { n: 2 }).await.unwrap();
    assert_eq!(settled(&transport, "pgnewtopic-announcer").await, 0);
    assert_eq!(calls.0.load(Ordering::SeqCst), 2);

    endpoint.shutdown().await.unwrap();
    transport.close().await;
    pool.close().await;
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgnewtopic.Burst")]
struct Burst {
    n: i64,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgnewtopic.BurstSeen")]
struct BurstSeen {
    n: i64,
}

#[courier::handler]
async fn burst(m: Burst, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.state::<Calls>()?.0.fetch_add(1, Ordering::SeqCst);
    ctx.publish(&BurstSeen { n: m.n })?;
    Ok(())
}

/// Many handlings at once create the same new topic, each in its own transaction: the
/// ones that lose the race wait for the winner's row and use it; none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_handlings_creating_the_same_topic_all_complete() {
    let clock = VirtualClock::starting_now();
    let transport = courier_tests::pg_transport::transport(&clock).await;
    let pool = pool().await;
    let queue = "pgnewtopic-burst";
    let calls = Calls::default();
    let endpoint = Endpoint::builder(queue)
        .transport(Arc::new(transport.clone()))
        .store(transport.store())
        .routes(Routes::new().send::<Burst>(queue).event::<BurstSeen>())
        .handler(burst)
        .state(calls.clone())
        .recoverability(RetryPolicy::none())
        .concurrency(8)
        .start()
        .await
        .unwrap();
    // Queued before the endpoint handles any of them: several are received together.
    let sender = transport
        .sender(queue, courier::SenderOptions::default())
        .await
        .unwrap();
    let n = 24;
    for i in 0..n {
        let envelope = courier::Envelope::new(serde_json::to_vec(&Burst { n: i }).unwrap())
            .with_message_type("pgnewtopic.Burst")
            .with_content_type("application/json");
        sender.send(envelope).await.unwrap();
    }
    assert_eq!(settled(&transport, queue).await, 0, "none dead-lettered");
    assert_eq!(
        calls.0.load(Ordering::SeqCst),
        u32::try_from(n).unwrap(),
        "each handled once"
    );
    assert!(topic_exists(&pool, "pgnewtopic.BurstSeen").await);

    endpoint.shutdown().await.unwrap();
    transport.close().await;
    pool.close().await;
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgnewtopic.PlaceOrder")]
struct PlaceOrder {
    order: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgnewtopic.OrderAccepted")]
struct OrderAccepted {
    order: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct OrderFlow {
    order: String,
}

#[courier::saga(name = "pgnewtopic.OrderFlow")]
impl OrderFlow {
    #[start(by = order)]
    async fn place(&mut self, m: PlaceOrder, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.order = m.order;
        ctx.publish(&OrderAccepted {
            order: self.order.clone(),
        })?;
        ctx.complete();
        Ok(())
    }
}

/// A saga that publishes an event of a topic that does not exist, and completes: the
/// instance is gone (completed, not left behind by a rolled-back handling) and the
/// message was not dead-lettered. Before, it never completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_publishing_to_a_topic_that_does_not_exist_completes() {
    let clock = VirtualClock::starting_now();
    let transport = courier_tests::pg_transport::transport(&clock).await;
    let pool = pool().await;
    let queue = "pgnewtopic-orders";
    assert!(!topic_exists(&pool, "pgnewtopic.OrderAccepted").await);
    let endpoint = Endpoint::builder(queue)
        .transport(Arc::new(transport.clone()))
        .store(transport.store())
        .routes(Routes::new().send::<PlaceOrder>(queue).event::<OrderAccepted>())
        .saga::<OrderFlow>()
        .recoverability(RetryPolicy::none())
        .start()
        .await
        .unwrap();

    endpoint.bus().send(&PlaceOrder { order: "o-1".into() }).await.unwrap();
    assert_eq!(
        settled(&transport, queue).await,
        0,
        "the saga's message was not dead-lettered"
    );
    let instances: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.saga WHERE saga_type = $1")
        .bind("pgnewtopic.OrderFlow")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(instances, 0, "the saga completed");
    let handled: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.inbox WHERE endpoint = $1")
        .bind(queue)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(handled, 1, "its handling committed");
    assert!(topic_exists(&pool, "pgnewtopic.OrderAccepted").await);

    endpoint.shutdown().await.unwrap();
    transport.close().await;
    pool.close().await;
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgnewtopic.Forward")]
struct Forward;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgnewtopic.Forwarded")]
struct Forwarded;

#[courier::handler]
async fn forward(_m: Forward, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.send(&Forwarded)?;
    Ok(())
}

/// A COMMAND to a queue that does not exist stays an error: the handling fails (here
/// dead-lettered at once, no retries) and the queue is not created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_to_a_queue_that_does_not_exist_still_fails() {
    let clock = VirtualClock::starting_now();
    let transport = courier_tests::pg_transport::transport(&clock).await;
    let pool = pool().await;
    let queue = "pgnewtopic-forwarder";
    let endpoint = Endpoint::builder(queue)
        .transport(Arc::new(transport.clone()))
        .store(transport.store())
        .routes(
            Routes::new()
                .send::<Forward>(queue)
                .send::<Forwarded>("pgnewtopic-nowhere"),
        )
        .handler(forward)
        .recoverability(RetryPolicy::none())
        .start()
        .await
        .unwrap();
    endpoint.bus().send(&Forward).await.unwrap();
    assert_eq!(settled(&transport, queue).await, 1, "dead-lettered");
    let created: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.entity WHERE name = 'pgnewtopic-nowhere'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(created, 0, "a send does not create a queue");

    endpoint.shutdown().await.unwrap();
    transport.close().await;
    pool.close().await;
}
