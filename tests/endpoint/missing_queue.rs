//! A send to a queue that does not exist (issue 13 audit): the failure says so and what
//! to do (create the queue: its endpoint creates it when it starts), it is retried (that
//! endpoint may start later), and `start()` warns of every routed queue missing then.
//! Before, with the embedded broker's store a handling failed with "the store failed; the
//! handler's transaction was rolled back: pings does not exist".

use std::sync::Arc;
use std::time::Duration;

use courier::conformance::Fixture;
use courier::recoverability::{headers, reasons};
use courier::{Clock, Context, Embedded, EmbeddedStore, HandlerError, ReceivedMessage, RetryPolicy, VirtualClock};

use crate::support::*;
use crate::tracing_capture::Capture;

/// An in-memory embedded broker and its own store (sends commit in the handling's
/// transaction).
async fn broker_with_store() -> (Fixture, EmbeddedStore) {
    let clock = VirtualClock::starting_now();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let broker = Embedded::builder().in_memory().clock(shared).open().await.unwrap();
    let store = broker.store();
    (Fixture::new(Arc::new(broker), clock), store)
}

/// Takes a `PlaceOrder` and sends a `Ping`, routed to `pings`.
fn pinger() -> FnHandler<PlaceOrder> {
    handler_fn("pinger", |m: PlaceOrder, ctx: &mut Context| {
        let sent = ctx.send(&Ping { n: m.id });
        Box::pin(async move {
            sent?;
            Ok::<(), HandlerError>(())
        })
    })
}

/// Sends one order to `sales`, whose handler sends to the missing `pings`; returns its
/// dead letter after an immediate retry.
async fn dead_letter_of_a_send_to_a_missing_queue(fx: &Fixture, store: Option<EmbeddedStore>) -> ReceivedMessage {
    let mut builder = endpoint(fx, "sales")
        .recoverability(RetryPolicy::none().immediate(1))
        .handler(pinger());
    if let Some(store) = store {
        builder = builder.store(store);
    }
    let sales = builder.start().await.unwrap();
    sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    wait_counts(&fx.transport, "sales", |c| c.dead_lettered == 1).await;
    assert_eq!(sales.stats().retried, 1, "retried: the queue may be created meanwhile");
    sales.shutdown().await.unwrap();
    dead_letters(&fx.transport, "sales").await.remove(0)
}

fn assert_says_create_pings(dead: &ReceivedMessage) {
    assert_eq!(
        dead.broker.dead_letter_reason.as_deref(),
        Some(reasons::RETRIES_EXHAUSTED)
    );
    assert_eq!(int_prop(dead, headers::FAILURE_ATTEMPTS), 2);
    let error = string_prop(dead, headers::FAILURE_ERROR);
    assert!(
        error.starts_with("the destination queue `pings` does not exist: create it"),
        "{error}"
    );
    assert!(error.contains("an endpoint creates its own queue"), "{error}");
    assert!(!error.contains("store failed"), "{error}");
    let description = dead.broker.dead_letter_description.clone().unwrap_or_default();
    assert!(
        description.contains("the destination queue `pings` does not exist: create it"),
        "{description}"
    );
}

/// The embedded broker's store sends in the handling's transaction: its commit found no
/// queue `pings`. That is a send's failure, named as one, not the store's.
#[tokio::test]
async fn a_send_to_a_missing_queue_in_the_stores_transaction_says_to_create_it() {
    let (fx, store) = broker_with_store().await;
    let dead = dead_letter_of_a_send_to_a_missing_queue(&fx, Some(store)).await;
    assert_says_create_pings(&dead);
}

/// Without a store the messages are sent after the handler: the same text.
#[tokio::test]
async fn a_send_to_a_missing_queue_without_a_store_says_to_create_it() {
    let fx = fixture().await;
    let dead = dead_letter_of_a_send_to_a_missing_queue(&fx, None).await;
    assert_says_create_pings(&dead);
}

/// The queue is created while the message waits for its delayed retry (its endpoint
/// started): the retry sends, and nothing is lost.
#[tokio::test]
async fn a_send_to_a_queue_created_later_goes_through_on_retry() {
    let (fx, store) = broker_with_store().await;
    let sales = endpoint(&fx, "sales")
        .recoverability(RetryPolicy::none().delayed([Duration::from_secs(60)]))
        .store(store)
        .handler(pinger())
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: 7 }).await.unwrap();
    eventually("the first attempt failed", || async { sales.stats().retried == 1 }).await;
    let pings = start(&fx, "pings", recording::<Ping>("ping", &Calls::default())).await;
    advance_when_scheduled(&fx, "sales", 1, Duration::from_secs(61)).await;
    eventually("the retry sent the ping", || async { pings.stats().completed == 1 }).await;
    assert_eq!(sales.stats().completed, 1);
    assert_eq!(sales.stats().dead_lettered, 0);
    sales.shutdown().await.unwrap();
    pings.shutdown().await.unwrap();
}

/// `start()` warns of the routed queues that do not exist, with the types routed to
/// each; not of its own queue, nor of queues that exist.
#[tokio::test]
async fn start_warns_of_routed_queues_that_do_not_exist() {
    // With one scoped subscriber alone, tracing computes a callsite's interest from the
    // subscriber of the thread that meets it first: another test's thread, which has
    // none, would switch the callsite off for this one too. A second one keeps the
    // interest computed over all of them.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let fx = fixture().await;
    let sales = start(&fx, "sales", pinger()).await;
    let warnings: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.level == tracing::Level::WARN && e.message.contains("do not exist"))
        .collect();
    assert_eq!(warnings.len(), 1, "{:?}", capture.events());
    let text = &warnings[0].message;
    assert!(text.contains("`pings` (for test.Ping)"), "{text}");
    assert!(text.contains("create each"), "{text}");
    assert!(!text.contains("`sales`"), "its own queue exists: {text}");
    sales.shutdown().await.unwrap();
    // Turned off (the process's next endpoint creates `pings`): no warning.
    let before = capture.events().len();
    let quiet = endpoint(&fx, "sales")
        .check_routes_at_start(false)
        .handler(pinger())
        .start()
        .await
        .unwrap();
    assert!(
        !capture.events()[before..]
            .iter()
            .any(|e| e.message.contains("do not exist")),
        "{:?}",
        capture.events()
    );
    quiet.shutdown().await.unwrap();
    // Once `pings` exists, no warning.
    let pings = start(&fx, "pings", recording::<Ping>("ping", &Calls::default())).await;
    let before = capture.events().len();
    let sales = start(&fx, "sales", pinger()).await;
    let later: Vec<_> = capture.events()[before..]
        .iter()
        .filter(|e| e.message.contains("do not exist"))
        .cloned()
        .collect();
    assert!(later.is_empty(), "{later:?}");
    sales.shutdown().await.unwrap();
    pings.shutdown().await.unwrap();
}
