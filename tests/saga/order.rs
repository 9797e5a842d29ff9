//! The order-fulfilment saga a user wrote from the docs (issue 13), with what it needed:
//! a payment provider's events carry only the payment id, so the saga finds its instance
//! by a correlation property (`#[saga(properties(..))]`, `correlate_by`, `#[handle(by = .., property = ..)]`); a
//! payment captured after its order was cancelled is refunded (the cancelled order is
//! kept a week for it); and, as docs/sagas.md now shows it (issue 34, part 4), a capture
//! that overtakes `PaymentStarted` comes back later (`SagaOptions::retry_not_found`)
//! instead of being refunded, and one that never finds an order is refunded by the
//! `#[not_found]` handler after the last try. On the three stores.

use std::sync::Arc;
use std::time::Duration;

use courier::saga::{SagaContext, SagaOptions};
use courier::{Clock, Context, Endpoint, EntityPath, HandlerError, QueueOptions, Routes, RunningEndpoint};
use courier_tests::eventually;
use courier_tests::stores::{StoreEnv, StoreKind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.OrderPlaced")]
struct OrderPlaced {
    order_id: String,
    cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.PaymentStarted")]
struct PaymentStarted {
    order_id: String,
    payment_id: String,
}

/// From the payment provider: it knows nothing of orders.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "payments.PaymentCaptured")]
struct PaymentCaptured {
    payment_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.PaymentTimedOut")]
struct PaymentTimedOut;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.ForgetOrder")]
struct ForgetOrder;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.ShipOrder")]
struct ShipOrder {
    order_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.CancelOrder")]
struct CancelOrder {
    order_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "payments.RefundPayment")]
struct RefundPayment {
    payment_id: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Order {
    order_id: String,
    cents: u64,
    paid: bool,
    cancelled: bool,
}

#[courier::saga(name = "shop.Order", properties(payment_id))]
impl Order {
    #[start(by = order_id)]
    async fn placed(&mut self, msg: OrderPlaced, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.order_id = msg.order_id;
        self.cents = msg.cents;
        ctx.request_timeout(Duration::from_secs(15 * 60), &PaymentTimedOut)?;
        Ok(())
    }

    #[handle(by = order_id)]
    async fn payment_started(&mut self, msg: PaymentStarted, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.correlate_by(Self::PAYMENT_ID, &msg.payment_id)?;
        Ok(())
    }

    #[handle(by = payment_id, property = payment_id)]
    async fn captured(&mut self, msg: PaymentCaptured, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if self.cancelled {
            // Too late: the order was cancelled.
            ctx.send(&RefundPayment {
                payment_id: msg.payment_id,
            })?;
        } else {
            self.paid = true;
            ctx.cancel_timeout::<PaymentTimedOut>();
            ctx.send(&ShipOrder {
                order_id: self.order_id.clone(),
            })?;
        }
        ctx.complete();
        Ok(())
    }

    #[timeout]
    async fn timed_out(&mut self, _t: PaymentTimedOut, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.send(&CancelOrder {
            order_id: self.order_id.clone(),
        })?;
        // Kept a week: a capture still on its way finds the cancelled order.
        self.cancelled = true;
        ctx.request_timeout(Duration::from_secs(7 * 86_400), &ForgetOrder)?;
        Ok(())
    }

    #[timeout]
    async fn forget(&mut self, _t: ForgetOrder, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }

    /// A capture that found no order after every try: give the money back.
    #[not_found]
    async fn captured_unknown(msg: PaymentCaptured, ctx: &mut Context) -> Result<(), HandlerError> {
        ctx.send(&RefundPayment {
            payment_id: msg.payment_id,
        })?;
        Ok(())
    }
}

/// How a capture that finds no order comes back: every 10 s, 3 times.
const RETRY_DELAY: Duration = Duration::from_secs(10);
const RETRIES: u32 = 3;

struct Shop {
    env: StoreEnv,
    orders: RunningEndpoint,
}

impl Shop {
    async fn open(kind: StoreKind) -> Self {
        let env = StoreEnv::new(kind).await;
        for queue in ["shipping", "payments"] {
            env.fx
                .transport
                .create_queue(queue, &QueueOptions::default())
                .await
                .unwrap();
        }
        let routes = Routes::new()
            .send::<OrderPlaced>("orders")
            .send::<PaymentStarted>("orders")
            .send::<PaymentCaptured>("orders")
            .send::<ShipOrder>("shipping")
            .send::<CancelOrder>("shipping")
            .send::<RefundPayment>("payments");
        let clock: Arc<dyn Clock> = Arc::new(env.fx.clock.clone());
        let orders = Endpoint::builder("orders")
            .transport(env.fx.transport.clone())
            .clock(clock)
            .routes(routes)
            .store(env.store.clone())
            .recoverability(courier::RetryPolicy::none())
            .saga_with::<Order>(SagaOptions::new().retry_not_found::<PaymentCaptured>(RETRY_DELAY, RETRIES))
            .start()
            .await
            .unwrap();
        Self { env, orders }
    }

    /// Sends `message` and waits until it is handled. Whatever the endpoint was doing
    /// before (a timeout that fired) is finished first: a completion counted late would
    /// otherwise pass for this message's.
    async fn handle<M: courier::Message>(&self, message: &M) {
        eventually("the endpoint idle", || async {
            let queue = self
                .env
                .fx
                .transport
                .counts(&EntityPath::queue("orders"))
                .await
                .unwrap();
            queue.active == 0 && self.orders.stats().running == 0
        })
        .await;
        let before = self.orders.stats();
        self.orders.bus().send(message).await.unwrap();
        eventually("the message handled", || async {
            let now = self.orders.stats();
            now.completed + now.dead_lettered > before.completed + before.dead_lettered && now.running == 0
        })
        .await;
    }

    /// Moves the clock past the next try of a capture that found no order, and waits
    /// until that copy is handled.
    async fn next_try(&self) {
        let before = self.orders.stats();
        self.env.fx.clock.advance(RETRY_DELAY + Duration::from_secs(1));
        eventually("the copy handled", || async {
            let now = self.orders.stats();
            now.completed + now.dead_lettered > before.completed + before.dead_lettered && now.running == 0
        })
        .await;
    }

    /// The types of the messages in `queue`, in order.
    async fn queued(&self, queue: &str) -> Vec<String> {
        self.env
            .fx
            .transport
            .peek(&EntityPath::queue(queue), 0, 100)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|m| m.envelope.message_type)
            .collect()
    }

    async fn rows(&self, table: &str) -> i64 {
        self.env
            .count(&format!("SELECT COUNT(*) FROM {}", self.env.kind.table(table)))
            .await
    }

    async fn finish(self) {
        self.orders.shutdown().await.unwrap();
        self.env.finish().await;
    }
}

fn placed(order_id: &str) -> OrderPlaced {
    OrderPlaced {
        order_id: order_id.into(),
        cents: 1999,
    }
}

fn started(order_id: &str, payment_id: &str) -> PaymentStarted {
    PaymentStarted {
        order_id: order_id.into(),
        payment_id: payment_id.into(),
    }
}

/// The provider's event carries only the payment id: it finds the order by its
/// correlation property, ships it, and the payment timeout never fires.
async fn a_payment_finds_its_order_by_the_payment_id(kind: StoreKind) {
    let shop = Shop::open(kind).await;
    shop.handle(&placed("o-1")).await;
    shop.handle(&started("o-1", "pay-1")).await;
    assert_eq!(shop.rows("saga_property").await, 1);
    shop.handle(&PaymentCaptured {
        payment_id: "pay-1".into(),
    })
    .await;
    assert_eq!(shop.queued("shipping").await, vec!["shop.ShipOrder"]);
    assert_eq!(shop.rows("saga").await, 0, "completed");
    assert_eq!(shop.rows("saga_property").await, 0, "its properties went with it");
    assert_eq!(shop.rows("saga_timeout").await, 0);
    assert_eq!(shop.orders.stats().dead_lettered, 0);
    shop.finish().await;
}

/// The payment times out and the order is cancelled, but kept; the capture that arrives
/// later finds the cancelled order and is refunded at once (too late, and known to be).
async fn a_late_capture_is_refunded(kind: StoreKind) {
    let shop = Shop::open(kind).await;
    shop.handle(&placed("o-2")).await;
    shop.handle(&started("o-2", "pay-2")).await;
    shop.env.fx.clock.advance(Duration::from_secs(15 * 60 + 1));
    eventually("the order cancelled", || async {
        shop.queued("shipping").await == vec!["shop.CancelOrder".to_owned()]
    })
    .await;
    assert_eq!(shop.rows("saga").await, 1, "kept for a late capture");
    shop.handle(&PaymentCaptured {
        payment_id: "pay-2".into(),
    })
    .await;
    assert_eq!(shop.queued("payments").await, vec!["payments.RefundPayment"]);
    assert_eq!(shop.orders.stats().sagas_not_found, 0, "it found the cancelled order");
    assert_eq!(shop.orders.stats().dead_lettered, 0);
    assert_eq!(shop.rows("saga").await, 0, "completed with the refund");
    shop.finish().await;
}

/// Regression (docs/sagas.md's order example): the capture overtakes `PaymentStarted`, so
/// no order has its payment id yet. It was refunded by the not-found handler at once,
/// though the payment was valid; now it comes back 10 s later, finds the order and ships
/// it, and nothing is refunded.
async fn an_early_capture_is_shipped_not_refunded(kind: StoreKind) {
    let shop = Shop::open(kind).await;
    shop.handle(&placed("o-6")).await;
    shop.handle(&PaymentCaptured {
        payment_id: "pay-6".into(),
    })
    .await;
    assert_eq!(shop.orders.stats().sagas_not_found_retried, 1);
    assert!(shop.queued("payments").await.is_empty(), "not refunded");
    shop.handle(&started("o-6", "pay-6")).await;
    shop.next_try().await;
    assert_eq!(shop.queued("shipping").await, vec!["shop.ShipOrder"]);
    assert!(shop.queued("payments").await.is_empty(), "not refunded");
    assert_eq!(shop.rows("saga").await, 0, "completed");
    assert_eq!(shop.orders.stats().dead_lettered, 0);
    shop.finish().await;
}

/// A payment id finds one order: a second order that claims it fails permanently and
/// is dead-lettered with a reason naming both; the first keeps it.
async fn a_property_value_belongs_to_one_instance(kind: StoreKind) {
    let shop = Shop::open(kind).await;
    shop.handle(&placed("o-3")).await;
    shop.handle(&placed("o-4")).await;
    shop.handle(&started("o-3", "pay-3")).await;
    shop.handle(&started("o-4", "pay-3")).await;
    assert_eq!(shop.orders.stats().dead_lettered, 1);
    let dead = shop
        .env
        .fx
        .transport
        .peek(&EntityPath::queue("orders").dead_letter(), 0, 10)
        .await
        .unwrap();
    let description = dead[0].broker.dead_letter_description.clone().unwrap_or_default();
    assert!(
        description.contains("payment_id") && description.contains("o-3") && description.contains("o-4"),
        "{description}"
    );
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(courier::recoverability::reasons::PERMANENT_FAILURE)
    );
    shop.handle(&PaymentCaptured {
        payment_id: "pay-3".into(),
    })
    .await;
    assert_eq!(shop.queued("shipping").await, vec!["shop.ShipOrder"], "o-3 was found");
    shop.finish().await;
}

/// A new payment replaces the instance's earlier payment id: the old one finds nothing.
async fn setting_a_property_again_replaces_it(kind: StoreKind) {
    let shop = Shop::open(kind).await;
    shop.handle(&placed("o-5")).await;
    shop.handle(&started("o-5", "pay-5a")).await;
    shop.handle(&started("o-5", "pay-5b")).await;
    assert_eq!(shop.rows("saga_property").await, 1);
    shop.handle(&PaymentCaptured {
        payment_id: "pay-5a".into(),
    })
    .await;
    for _ in 0..RETRIES {
        assert!(shop.queued("payments").await.is_empty(), "not before the last try");
        shop.next_try().await;
    }
    assert_eq!(
        shop.queued("payments").await,
        vec!["payments.RefundPayment"],
        "the old id finds no order: refunded by the not-found handler after the last try"
    );
    let stats = shop.orders.stats();
    assert_eq!(stats.sagas_not_found, 1 + u64::from(RETRIES), "every arrival");
    assert_eq!(stats.sagas_not_found_retried, u64::from(RETRIES));
    assert_eq!(
        stats.sagas_not_found_handled, 1,
        "the not-found handler ran once, counted apart"
    );
    shop.handle(&PaymentCaptured {
        payment_id: "pay-5b".into(),
    })
    .await;
    assert_eq!(shop.queued("shipping").await, vec!["shop.ShipOrder"]);
    shop.finish().await;
}

on_every_store!(
    a_payment_finds_its_order_by_the_payment_id,
    a_late_capture_is_refunded,
    an_early_capture_is_shipped_not_refunded,
    a_property_value_belongs_to_one_instance,
    setting_a_property_again_replaces_it,
);
