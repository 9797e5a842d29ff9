//! Saga instances written by the real saga runtime, read and completed through the
//! operations API on the embedded broker's file: the state, the keyed timeout and its
//! message type as the runtime stored them; a completed instance's timeout never fires.

use std::sync::Arc;
use std::time::Duration;

use courier::admin::{EmbeddedAdmin, SagaFilter, StoreAdmin, TimeoutFilter, TimeoutState};
use courier::saga::SagaContext;
use courier::{Clock, Embedded, Endpoint, EntityPath, HandlerError, QueueOptions, Routes, Transport, VirtualClock};
use courier_tests::eventually;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "adm.CheckoutStarted")]
struct CheckoutStarted {
    cart: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "adm.CheckoutExpired")]
struct CheckoutExpired;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "adm.ReleaseStock")]
struct ReleaseStock {
    cart: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkout {
    cart: String,
}

#[courier::saga(name = "adm.Checkout")]
impl Checkout {
    #[start(by = cart)]
    async fn started(&mut self, msg: CheckoutStarted, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.cart = msg.cart;
        ctx.request_timeout(Duration::from_secs(15 * 60), &CheckoutExpired)?;
        Ok(())
    }

    #[timeout]
    async fn expired(&mut self, _t: CheckoutExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.send(&ReleaseStock {
            cart: self.cart.clone(),
        })?;
        ctx.complete();
        Ok(())
    }
}

#[tokio::test]
async fn an_instance_of_the_runtime_is_shown_and_completed_by_hand_and_its_timeout_never_fires() {
    let clock = VirtualClock::starting_now();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let broker = Embedded::builder()
        .in_memory()
        .clock(shared.clone())
        .open()
        .await
        .unwrap();
    broker
        .create_queue("adm-stock", &QueueOptions::default())
        .await
        .unwrap();
    let endpoint = Endpoint::builder("adm-checkout")
        .transport(broker.clone())
        .store(broker.store())
        .clock(shared)
        .routes(
            Routes::new()
                .send::<CheckoutStarted>("adm-checkout")
                .send::<ReleaseStock>("adm-stock"),
        )
        .saga::<Checkout>()
        .start()
        .await
        .unwrap();
    let admin = EmbeddedAdmin::new(broker.clone());
    endpoint
        .bus()
        .send(&CheckoutStarted { cart: "cart-1".into() })
        .await
        .unwrap();
    eventually("the instance", || async {
        admin.saga("adm.Checkout", "cart-1").await.is_ok() && endpoint.stats().running == 0
    })
    .await;

    let shown = admin.saga("adm.Checkout", "cart-1").await.unwrap();
    assert_eq!(shown.state, serde_json::json!({"cart": "cart-1"}));
    assert_eq!(shown.summary.version, 1);
    assert_eq!(shown.timeouts.len(), 1);
    let t = &shown.timeouts[0];
    assert_eq!((t.endpoint.as_str(), t.state), ("adm-checkout", TimeoutState::Waiting));
    assert_eq!(t.message_type.as_deref(), Some("adm.CheckoutExpired"));
    assert_eq!(t.key.as_deref(), Some("adm.CheckoutExpired"));
    assert_eq!(t.due_at, shown.summary.created_at + chrono::Duration::minutes(15));
    let listed = admin
        .sagas("adm.Checkout", &SagaFilter::default().has_pending_timeout(true))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);

    let done = admin
        .complete_saga("adm.Checkout", "cart-1", "the customer paid by phone")
        .await
        .unwrap();
    assert_eq!((done.version, done.timeouts_removed), (1, 1));
    assert!(admin.timeouts(&TimeoutFilter::default()).await.unwrap().is_empty());

    // Past the timeout's due time; then a later message is handled: the completed
    // instance's timeout fired nothing.
    clock.advance(Duration::from_secs(20 * 60));
    endpoint
        .bus()
        .send(&CheckoutStarted { cart: "cart-2".into() })
        .await
        .unwrap();
    eventually("the second instance", || async {
        admin.saga("adm.Checkout", "cart-2").await.is_ok() && endpoint.stats().running == 0
    })
    .await;
    let stock = broker.counts(&EntityPath::queue("adm-stock")).await.unwrap();
    assert_eq!(stock.active, 0, "no stock released for the completed cart");
    let pending: Vec<String> = admin
        .timeouts(&TimeoutFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.correlation)
        .collect();
    assert_eq!(pending, vec!["cart-2"]);
    assert!(admin.saga("adm.Checkout", "cart-1").await.is_err());
    endpoint.shutdown().await.unwrap();
}
