//! Outgoing messages the transport refuses, on an endpoint without a store: the refusal
//! comes back from `ctx.send` at once, a handler that returns it (however wrapped) fails
//! permanently with a reason naming the outgoing message, a handler may handle it, and
//! what only the send can tell fails the handling permanently too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use courier::recoverability::reasons;
use courier::{Context, ErrorKind, HandlerError, QueueOptions, SendOptions};
use serde::{Deserialize, Serialize};

use crate::support::*;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "refused.Order")]
struct Order {
    note_len: usize,
    to: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "refused.Invoice")]
struct Invoice {
    note: String,
}

/// A handler's own error type that keeps Courier's error as its cause.
#[derive(Debug, thiserror::Error)]
enum BillingError {
    #[error("could not issue the invoice")]
    Send(#[source] courier::Error),
}

#[courier::handler]
async fn wrapped(order: Order, ctx: &mut Context) -> Result<(), BillingError> {
    let invoice = Invoice {
        note: "n".repeat(order.note_len),
    };
    ctx.send_with(&invoice, SendOptions::new().to(order.to))
        .map_err(BillingError::Send)?;
    Ok(())
}

#[derive(Clone, Default)]
struct Refusals(Arc<AtomicU32>);

/// Sends a shorter invoice when the long one is refused.
#[courier::handler]
async fn falls_back(order: Order, ctx: &mut Context) -> Result<(), HandlerError> {
    let long = Invoice {
        note: "n".repeat(order.note_len),
    };
    if let Err(e) = ctx.send_with(&long, SendOptions::new().to(order.to.clone())) {
        assert!(matches!(e.kind(), ErrorKind::MessageTooLarge { .. }), "{e}");
        ctx.state::<Refusals>()?.0.fetch_add(1, Ordering::SeqCst);
        let short = Invoice {
            note: "see the portal".into(),
        };
        ctx.send_with(&short, SendOptions::new().to(order.to))?;
    }
    Ok(())
}

const TOO_LONG: usize = 2 * 1024 * 1024;

#[tokio::test]
async fn a_refusal_wrapped_in_the_handlers_own_error_still_dead_letters_at_once() {
    let fx = fixture().await;
    fx.transport
        .create_queue("invoices", &QueueOptions::default())
        .await
        .unwrap();
    let billing = start(&fx, "billing", wrapped).await;
    let order = Order {
        note_len: TOO_LONG,
        to: "invoices".into(),
    };
    billing
        .bus()
        .send_with(&order, SendOptions::new().to("billing"))
        .await
        .unwrap();
    eventually("the dead letter", || async { billing.stats().dead_lettered == 1 }).await;
    let dead = dead_letters(&fx.transport, "billing").await;
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(reasons::INVALID_OUTGOING_MESSAGE)
    );
    let description = dead[0].broker.dead_letter_description.as_deref().unwrap_or("");
    assert!(description.contains("refused.Invoice"), "{description}");
    assert!(description.contains("could not issue the invoice"), "{description}");
    assert_eq!(billing.stats().retried, 0);
    assert_eq!(counts(&fx.transport, "invoices").await.active, 0);
    billing.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_handler_that_handles_the_refusal_succeeds() {
    let fx = fixture().await;
    fx.transport
        .create_queue("invoices", &QueueOptions::default())
        .await
        .unwrap();
    let refusals = Refusals::default();
    let billing = endpoint(&fx, "billing")
        .state(refusals.clone())
        .handler(falls_back)
        .start()
        .await
        .unwrap();
    let order = Order {
        note_len: TOO_LONG,
        to: "invoices".into(),
    };
    billing
        .bus()
        .send_with(&order, SendOptions::new().to("billing"))
        .await
        .unwrap();
    eventually("completion", || async { billing.stats().completed == 1 }).await;
    assert_eq!(refusals.0.load(Ordering::SeqCst), 1);
    assert_eq!(counts(&fx.transport, "invoices").await.active, 1, "the short one left");
    assert_eq!(billing.stats().dead_lettered, 0);
    billing.shutdown().await.unwrap();
}

/// Only the send knows that the destination needs session ids: without a store the
/// handling fails at dispatch, permanently.
#[tokio::test]
async fn a_refusal_only_the_send_can_tell_dead_letters_at_once_without_a_store() {
    let fx = fixture().await;
    fx.transport
        .create_queue("sessions", &QueueOptions::default().requires_session(true))
        .await
        .unwrap();
    let billing = start(&fx, "billing", wrapped).await;
    let order = Order {
        note_len: 10,
        to: "sessions".into(),
    };
    billing
        .bus()
        .send_with(&order, SendOptions::new().to("billing"))
        .await
        .unwrap();
    eventually("the dead letter", || async { billing.stats().dead_lettered == 1 }).await;
    let dead = dead_letters(&fx.transport, "billing").await;
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(reasons::INVALID_OUTGOING_MESSAGE)
    );
    assert_eq!(billing.stats().retried, 0);
    billing.shutdown().await.unwrap();
}

/// `deliver_after` a delay that cannot be added to now is an error, not a panic.
#[tokio::test]
async fn an_unrepresentable_delay_is_refused_when_sending() {
    let fx = fixture().await;
    let billing = start(&fx, "billing", wrapped).await;
    let order = Order {
        note_len: 1,
        to: "invoices".into(),
    };
    let options = SendOptions::new()
        .to("billing")
        .deliver_after(std::time::Duration::from_secs(u64::MAX / 4));
    let e = billing.bus().send_with(&order, options).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidScheduleTime { .. }), "{e}");
    billing.shutdown().await.unwrap();
}
