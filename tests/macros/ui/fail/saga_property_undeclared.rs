//! A correlation property is declared once, on the saga (`#[saga(properties(..))]`):
//! `#[handle(property = ..)]` naming a misspelt or an undeclared property does not
//! compile, and `correlate_by` takes only a declared property's constant.
use courier::HandlerError;
use courier::saga::SagaContext;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Placed {
    order_id: String,
    payment_id: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Captured {
    payment_id: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Refunded {
    refund_id: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Order;

#[courier::saga(properties(payment_id))]
impl Order {
    #[start(by = order_id)]
    async fn placed(&mut self, msg: Placed, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.correlate_by(Self::PAYMNET_ID, &msg.payment_id)?;
        ctx.correlate_by("payment_id", &msg.payment_id)?;
        Ok(())
    }

    #[handle(by = payment_id, property = paymnet_id)]
    async fn captured(&mut self, _msg: Captured, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = refund_id, property = "refund_id")]
    async fn refunded(&mut self, _msg: Refunded, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
