//! Routing checked early (issue 13, point 8): a handler or saga that declares what it
//! sends (`#[handler(sends(..), publishes(..))]`, `#[saga(sends(..))]`) makes `start()`
//! fail with every missing route listed; a send with no route that was not declared
//! fails the handling for good at the first send (it was retried 16 times, for a route
//! table that cannot change while the endpoint runs).

use courier::recoverability::reasons;
use courier::saga::SagaContext;
use courier::{Context, ErrorKind, HandlerError, SendOptions};
use serde::{Deserialize, Serialize};

use crate::support::*;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "unrouted.Charge")]
struct Charge {
    order: u64,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "unrouted.Refund")]
struct Refund {
    order: u64,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "unrouted.Charged")]
struct Charged {
    order: u64,
}

#[courier::handler(sends(Refund), publishes(Charged))]
async fn charge(msg: Charge, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.publish(&Charged { order: msg.order })?;
    Ok(())
}

/// Declares nothing, and sends a type that has no route.
#[courier::handler]
async fn charge_quietly(msg: Charge, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.send(&Refund { order: msg.order })?;
    Ok(())
}

#[derive(Default, Serialize, Deserialize)]
struct Billing;

#[courier::saga(name = "unrouted.Billing", sends(Refund))]
impl Billing {
    #[start(by = order)]
    async fn charged(&mut self, msg: Charge, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.send(&Refund { order: msg.order })?;
        Ok(())
    }
}

#[tokio::test]
async fn declared_sends_without_a_route_stop_the_start_with_the_list() {
    let fx = fixture().await;
    let err = endpoint(&fx, "billing")
        .handler(charge)
        .start()
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(matches!(err.kind(), ErrorKind::InvalidOptions { .. }), "{text}");
    assert!(text.contains("2 message type(s)"), "{text}");
    assert!(
        text.contains("sends unrouted.Refund: add Routes::send::<T>(queue)"),
        "{text}"
    );
    assert!(
        text.contains("publishes unrouted.Charged: add Routes::event::<T>()"),
        "{text}"
    );
    assert!(text.contains("charge"), "names the handler: {text}");
    // With the routes, it starts.
    let routes = routes().send::<Refund>("refunds").event::<Charged>();
    let ok = endpoint(&fx, "billing")
        .routes(routes)
        .handler(charge)
        .start()
        .await
        .unwrap();
    ok.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_sagas_declared_sends_are_checked_too() {
    let fx = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(courier::SqliteStore::open(dir.path().join("s.db")).await.unwrap());
    courier::Store::migrate(&*store).await.unwrap();
    let err = endpoint(&fx, "billing")
        .store(store)
        .saga::<Billing>()
        .start()
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("unrouted.Billing sends unrouted.Refund"), "{text}");
}

#[tokio::test]
async fn an_undeclared_send_without_a_route_dead_letters_at_once() {
    let fx = fixture().await;
    let billing = start(&fx, "billing", charge_quietly).await;
    billing
        .bus()
        .send_with(&Charge { order: 1 }, SendOptions::new().to("billing"))
        .await
        .unwrap();
    eventually("the dead letter", || async { billing.stats().dead_lettered == 1 }).await;
    assert_eq!(billing.stats().retried, 0, "not retried: the routes will not change");
    let dead = dead_letters(&fx.transport, "billing").await;
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(reasons::INVALID_OUTGOING_MESSAGE)
    );
    let description = dead[0].broker.dead_letter_description.as_deref().unwrap_or("");
    assert!(
        description.contains("unrouted.Refund") && description.contains("Routes::send"),
        "{description}"
    );
    billing.shutdown().await.unwrap();
}
