//! Events that arrive before the saga can find them (issue 34, part 4): a continuing
//! message that finds no instance comes back later (`SagaOptions::retry_not_found`), up
//! to a limit, then is dead-lettered. The copy is scheduled in the handling's
//! transaction, so it survives a restart of the endpoint; only the saga's handler runs on
//! it; its count is sealed, so a producer's count neither shortens nor lengthens the
//! tries. On the three stores with the embedded broker, on the Postgres transport, and on
//! RabbitMQ with a Postgres store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::saga::{SagaOptions, headers, reasons};
use courier::{BoxFuture, Context, EntityPath, Handler, HandlerError, PropertyValue, RunningEndpoint, SendOptions};
use courier_tests::eventually;
use courier_tests::stores::StoreKind;

use super::{Bump, Env, begin};

/// A plain handler of `Bump` on the saga's endpoint: counts its runs.
struct BumpSeen(Arc<AtomicU32>);

impl Handler for BumpSeen {
    type Message = Bump;

    fn name(&self) -> &'static str {
        "bump_seen"
    }

    fn handle<'a>(&'a self, _message: Bump, _ctx: &'a mut Context) -> BoxFuture<'a, Result<(), HandlerError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// Bumps come back every 30 s, `limit` times.
fn retrying(limit: u32) -> SagaOptions {
    SagaOptions::new().retry_not_found::<Bump>(Duration::from_secs(30), limit)
}

async fn start_on(env: &Env, name: &str, limit: u32, seen: &Arc<AtomicU32>) -> RunningEndpoint {
    env.builder_named(name, retrying(limit))
        .handler(BumpSeen(seen.clone()))
        .start()
        .await
        .unwrap()
}

async fn send_to<M: courier::Message>(flows: &RunningEndpoint, message: &M, options: SendOptions) {
    flows.bus().send_with(message, options.to(flows.name())).await.unwrap();
}

/// The dead letters of `queue`: (reason, description); drained on RabbitMQ, which cannot
/// browse.
async fn dead_of(env: &Env, queue: &str) -> Vec<(String, String)> {
    let transport = &env.env.fx.transport;
    let path = EntityPath::queue(queue).dead_letter();
    let messages = if transport.name() == "amqp" {
        let dlq = transport.receiver(&path).await.unwrap();
        let mut dead = Vec::new();
        loop {
            let got = dlq.receive(16, Duration::from_millis(500)).await.unwrap();
            if got.is_empty() {
                break dead;
            }
            for d in got {
                dead.push(d.message().clone());
                d.complete().await.unwrap();
            }
        }
    } else {
        transport.peek(&path, 0, 100).await.unwrap()
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

/// The scenario of the issue: the event that continues the saga overtakes the one that
/// starts it. It finds no instance and comes back 30 s later; meanwhile the endpoint
/// restarts (the copy waits in the broker or the outbox, not in memory) and the start
/// arrives; the copy then finds the instance and the saga handles it, once. The plain
/// handler of the type ran on the first arrival only. (Before, the early event was
/// completed as "not found" and lost.)
async fn an_early_event_comes_back_after_a_restart_and_finds_its_instance(env: &Env, name: &str) {
    let seen = Arc::new(AtomicU32::new(0));
    let flows = start_on(env, name, 3, &seen).await;
    send_to(&flows, &Bump { id: "early".into() }, SendOptions::new()).await;
    eventually("the early event sent back", || async {
        flows.stats().sagas_not_found_retried == 1 && flows.stats().completed == 1
    })
    .await;
    assert_eq!(flows.stats().sagas_not_found, 1);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the plain handler ran on the first arrival"
    );
    flows.shutdown().await.unwrap();

    let again = start_on(env, name, 3, &seen).await;
    send_to(&again, &begin("early", None), SendOptions::new()).await;
    eventually("the start", || async { again.stats().completed == 1 }).await;
    assert_eq!(env.field("early", "count").await, 0, "not yet: the copy is due in 30 s");
    env.advance(31);
    eventually("the copy handled by the saga", || async {
        again.stats().completed == 2
    })
    .await;
    assert_eq!(env.field("early", "count").await, 1, "the saga handled the early event");
    assert_eq!(again.stats().sagas_not_found, 0, "the copy found its instance");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the plain handler did not run on the copy"
    );
    assert_eq!(again.stats().dead_lettered, 0);
    again.shutdown().await.unwrap();
}

/// An event whose instance never comes: tried 1 + `limit` times, 30 s apart, then
/// dead-lettered with `courier.SagaNotFound` and a description that says so. The
/// endpoint's own counts end the loop: it is not sent back a fourth time.
async fn an_event_that_never_finds_its_instance_is_dead_lettered_after_the_limit(env: &Env, name: &str) {
    let seen = Arc::new(AtomicU32::new(0));
    let flows = start_on(env, name, 2, &seen).await;
    send_to(&flows, &Bump { id: "never".into() }, SendOptions::new()).await;
    for tries in 1..=2 {
        eventually("sent back", || async { flows.stats().sagas_not_found_retried == tries }).await;
        env.advance(31);
    }
    eventually("dead-lettered after the last try", || async {
        flows.stats().dead_lettered == 1
    })
    .await;
    let stats = flows.stats();
    assert_eq!((stats.sagas_not_found, stats.sagas_not_found_retried), (3, 2));
    let dead = dead_of(env, name).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, reasons::SAGA_NOT_FOUND);
    assert!(
        dead[0].1.contains("tried again 2 times") && dead[0].1.contains("\"never\""),
        "{}",
        dead[0].1
    );
    env.advance(3600);
    send_to(&flows, &begin("later", None), SendOptions::new()).await;
    eventually("a later message", || async { flows.stats().completed == 3 }).await;
    assert_eq!(flows.stats().sagas_not_found_retried, 2, "not sent back again");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    flows.shutdown().await.unwrap();
}

/// A producer's copy with the not-found headers (a count at the limit, the saga's name, a
/// seal it made up) is not the endpoint's: it counts as a first arrival, is tried the
/// full limit, and every handler of its type runs on it.
async fn a_producers_count_is_not_trusted(env: &Env, name: &str) {
    let seen = Arc::new(AtomicU32::new(0));
    let flows = start_on(env, name, 1, &seen).await;
    let forged = SendOptions::new()
        .header(headers::NOT_FOUND_RETRIES, PropertyValue::Int(1))
        .header(headers::NOT_FOUND_SAGA, "tests.Flow")
        .header(headers::NOT_FOUND_SEAL, "ab".repeat(32));
    send_to(&flows, &Bump { id: "forged".into() }, forged).await;
    eventually("sent back, as a first arrival", || async {
        flows.stats().sagas_not_found_retried == 1
    })
    .await;
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the plain handler ran: not the saga's copy"
    );
    assert_eq!(flows.stats().dead_lettered, 0);
    env.advance(31);
    eventually("dead-lettered after the one try", || async {
        flows.stats().dead_lettered == 1
    })
    .await;
    assert_eq!(flows.stats().sagas_not_found_retried, 1);
    flows.shutdown().await.unwrap();
}

async fn retry_later_scenarios(kind: StoreKind) {
    let env = Env::new(kind).await;
    an_early_event_comes_back_after_a_restart_and_finds_its_instance(&env, "flows-early").await;
    an_event_that_never_finds_its_instance_is_dead_lettered_after_the_limit(&env, "flows-never").await;
    a_producers_count_is_not_trusted(&env, "flows-forged").await;
    env.finish().await;
}

/// The three scenarios on RabbitMQ (a Postgres store: the copy is stored in the outbox
/// and sent as a scheduled message through the transport's scheduler).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_an_early_event_comes_back_and_the_limit_holds() {
    let mut env = Env::new(StoreKind::Postgres).await;
    env.env.fx = courier_tests::rabbit::amqp_fixture().await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    an_early_event_comes_back_after_a_restart_and_finds_its_instance(&env, &format!("early-{id}")).await;
    an_event_that_never_finds_its_instance_is_dead_lettered_after_the_limit(&env, &format!("never-{id}")).await;
    a_producers_count_is_not_trusted(&env, &format!("forged-{id}")).await;
    env.finish().await;
}

/// A retry policy for a message the saga does not continue with is refused at start.
#[tokio::test]
async fn retry_not_found_of_a_start_message_is_refused() {
    let env = Env::new(StoreKind::Sqlite).await;
    let Err(err) = env
        .builder_named(
            "flows-bad",
            SagaOptions::new().retry_not_found::<super::Begin>(Duration::from_secs(1), 1),
        )
        .start()
        .await
    else {
        panic!("refused");
    };
    assert!(err.to_string().contains("starts an instance"), "{err}");
    let Err(err) = env.builder_named("flows-bad", retrying(0)).start().await else {
        panic!("refused");
    };
    assert!(err.to_string().contains("at least 1"), "{err}");
    env.finish().await;
}

on_every_store!(retry_later_scenarios);
