//! `#[saga(properties(..))]` declares a saga's correlation properties: each gives the state
//! type a typed constant for `correlate_by`, and `#[handle(property = ..)]` names one
//! (as a name, or as the string of its name).
use courier::HandlerError;
use courier::saga::{Property, SagaContext};

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
struct Shipped {
    parcel: u64,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Order;

#[courier::saga(properties(payment_id, parcel))]
impl Order {
    #[start(by = order_id)]
    async fn placed(&mut self, msg: Placed, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.correlate_by(Self::PAYMENT_ID, &msg.payment_id)?;
        ctx.correlate_by(Self::PARCEL, 7)?;
        Ok(())
    }

    #[handle(by = payment_id, property = payment_id)]
    async fn captured(&mut self, _msg: Captured, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = parcel, property = "parcel")]
    async fn shipped(&mut self, _msg: Shipped, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {
    const PAYMENT_ID: Property = Order::PAYMENT_ID;
    assert_eq!(PAYMENT_ID.name(), "payment_id");
    assert_eq!(Order::PARCEL, Property::new("parcel"));
}
