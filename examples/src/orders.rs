//! An order saga as a user writes it from the docs: place an order, ask for a payment with
//! a time limit, ship when the payment is captured, cancel when the time is up, and refund
//! a capture that arrives for an order that was cancelled.
//!
//! - `orders` runs the `Order` saga. The payment provider's events carry only a payment
//!   id, so the saga records it as a correlation property (declared with
//!   `#[saga(properties(payment_id))]`, set with `ctx.correlate_by(Self::PAYMENT_ID, ..)`)
//!   and `PaymentCaptured` finds the order by it (`#[handle(by = payment_id, property = payment_id)]`).
//!   A capture that finds no order runs the saga's `#[not_found]` handler: a refund.
//! - `payments` stands in for the provider: it starts a payment at once and captures it
//!   after a delay (order `o-1` quickly, order `o-2` after its time limit).
//! - `shipping` ships, cancels and refunds: it reports what happened.
//!
//! Run it with `cargo run -p courier-examples --bin orders`: no server (the broker and the
//! sagas live in memory), about two seconds, exits 0 only if `o-1` was shipped and `o-2`
//! cancelled and refunded.

#![allow(clippy::print_stdout)]

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use courier::prelude::*;
use courier::saga::SagaContext;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// How long an order waits for its payment.
const PAYMENT_WINDOW: Duration = Duration::from_millis(800);

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.PlaceOrder")]
struct PlaceOrder {
    order_id: String,
    cents: u64,
    /// How long the (simulated) provider takes to capture the payment.
    capture_after_ms: u64,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "payments.RequestPayment")]
struct RequestPayment {
    order_id: String,
    cents: u64,
    capture_after_ms: u64,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "payments.PaymentStarted")]
struct PaymentStarted {
    order_id: String,
    payment_id: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "payments.PaymentCaptured")]
struct PaymentCaptured {
    payment_id: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.PaymentTimedOut")]
struct PaymentTimedOut;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "shipping.ShipOrder")]
struct ShipOrder {
    order_id: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "shipping.CancelOrder")]
struct CancelOrder {
    order_id: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "payments.RefundPayment")]
struct RefundPayment {
    payment_id: String,
}

fn routes() -> Routes {
    Routes::new()
        .send::<PlaceOrder>("orders")
        .send::<PaymentStarted>("orders")
        .send::<PaymentCaptured>("orders")
        .send::<RequestPayment>("payments")
        .send::<ShipOrder>("shipping")
        .send::<CancelOrder>("shipping")
        .send::<RefundPayment>("shipping")
}

/// An order, from its placement to its shipping or cancellation.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Order {
    order_id: String,
}

#[courier::saga(
    name = "shop.Order",
    sends(RequestPayment, ShipOrder, CancelOrder, RefundPayment),
    properties(payment_id)
)]
impl Order {
    #[start(by = order_id)]
    async fn placed(&mut self, msg: PlaceOrder, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.order_id = msg.order_id.clone();
        ctx.send(&RequestPayment {
            order_id: msg.order_id,
            cents: msg.cents,
            capture_after_ms: msg.capture_after_ms,
        })?;
        // Keyed by its type: a PlaceOrder sent twice leaves one timeout.
        ctx.request_timeout(PAYMENT_WINDOW, &PaymentTimedOut)?;
        Ok(())
    }

    #[handle(by = order_id)]
    async fn payment_started(&mut self, msg: PaymentStarted, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.correlate_by(Self::PAYMENT_ID, &msg.payment_id)?;
        Ok(())
    }

    #[handle(by = payment_id, property = payment_id)]
    async fn captured(&mut self, _msg: PaymentCaptured, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.cancel_timeout::<PaymentTimedOut>();
        ctx.send(&ShipOrder {
            order_id: self.order_id.clone(),
        })?;
        ctx.complete();
        Ok(())
    }

    #[timeout]
    async fn timed_out(&mut self, _t: PaymentTimedOut, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.send(&CancelOrder {
            order_id: self.order_id.clone(),
        })?;
        ctx.complete();
        Ok(())
    }

    /// The order is gone (cancelled when its time was up): give the money back.
    #[not_found]
    async fn captured_too_late(msg: PaymentCaptured, ctx: &mut Context) -> Result<(), HandlerError> {
        ctx.send(&RefundPayment {
            payment_id: msg.payment_id,
        })?;
        Ok(())
    }
}

/// The payment provider: starts a payment and captures it later.
#[courier::handler(sends(PaymentStarted, PaymentCaptured))]
async fn request_payment(msg: RequestPayment, ctx: &mut Context) -> Result<(), HandlerError> {
    let payment_id = format!("pay-{}", msg.order_id);
    ctx.send(&PaymentStarted {
        order_id: msg.order_id,
        payment_id: payment_id.clone(),
    })?;
    let later = SendOptions::new().deliver_after(Duration::from_millis(msg.capture_after_ms));
    ctx.send_with(&PaymentCaptured { payment_id }, later)?;
    Ok(())
}

/// What the shipping desk saw, for the story.
#[derive(Clone)]
struct Desk(mpsc::UnboundedSender<String>);

impl Desk {
    fn note(ctx: &Context, line: String) -> Result<(), HandlerError> {
        ctx.state::<Desk>()?
            .0
            .send(line)
            .map_err(|_| HandlerError::msg("the story has ended"))
    }
}

#[courier::handler]
async fn ship(msg: ShipOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    Desk::note(ctx, format!("{} shipped", msg.order_id))
}

#[courier::handler]
async fn cancel(msg: CancelOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    Desk::note(ctx, format!("{} cancelled: not paid in time", msg.order_id))
}

#[courier::handler]
async fn refund(msg: RefundPayment, ctx: &mut Context) -> Result<(), HandlerError> {
    Desk::note(
        ctx,
        format!("{} refunded: captured after its order was cancelled", msg.payment_id),
    )
}

async fn run() -> Result<Vec<String>, Box<dyn Error>> {
    // Listen from the start (its own handler, because a program started as a script's
    // background job inherits SIGINT ignored), so a Ctrl-C while the endpoints start
    // counts too.
    let mut ctrl_c = tokio::spawn(tokio::signal::ctrl_c());
    let broker = Embedded::in_memory().await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let orders = Endpoint::builder("orders")
        .transport(broker.clone())
        .store(broker.store())
        .routes(routes())
        .saga::<Order>()
        .start()
        .await?;
    let payments = Endpoint::builder("payments")
        .transport(broker.clone())
        .routes(routes())
        .handler(request_payment)
        .start()
        .await?;
    let shipping = Endpoint::builder("shipping")
        .transport(broker.clone())
        .routes(routes())
        .state(Desk(tx))
        .handler(ship)
        .handler(cancel)
        .handler(refund)
        .start()
        .await?;
    // The story runs until it ends or Ctrl-C; either way the endpoints then stop
    // gracefully.
    let story = async {
        for (order_id, capture_after_ms) in [("o-1", 100), ("o-2", 1_500)] {
            let order = PlaceOrder {
                order_id: order_id.to_owned(),
                cents: 1999,
                capture_after_ms,
            };
            orders.bus().send(&order).await?;
            println!("placed {order_id}: its payment is captured after {capture_after_ms} ms");
        }
        let mut seen = Vec::new();
        while seen.len() < 3 {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some(line)) => {
                    println!("  {line}");
                    seen.push(line);
                }
                _ => return Err(format!("the story stopped after {seen:?}").into()),
            }
        }
        Ok::<_, Box<dyn Error>>(seen)
    };
    let told = tokio::select! {
        told = story => Some(told),
        Ok(Ok(())) = &mut ctrl_c => None,
    };
    for endpoint in [orders, payments, shipping] {
        endpoint.shutdown().await?;
    }
    let Some(told) = told else {
        return Err(Interrupted.into());
    };
    let mut seen = told?;
    seen.sort();
    Ok(seen)
}

/// Ctrl-C (SIGINT) was pressed: the endpoints were shut down gracefully.
#[derive(Debug)]
struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted by Ctrl-C; the endpoints stopped gracefully (the broker lived in memory)")
    }
}

impl Error for Interrupted {}

#[tokio::main]
async fn main() -> ExitCode {
    let expected = [
        "o-1 shipped",
        "o-2 cancelled: not paid in time",
        "pay-o-2 refunded: captured after its order was cancelled",
    ];
    match run().await {
        Err(e) if e.is::<Interrupted>() => {
            println!("orders: {e}");
            ExitCode::from(130)
        }
        Ok(seen) if seen == expected => {
            println!("ok: o-1 shipped; o-2 cancelled when its time was up, and its late payment refunded");
            ExitCode::SUCCESS
        }
        Ok(seen) => {
            eprintln!("orders: FAILED: expected {expected:?}, saw {seen:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("orders: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
