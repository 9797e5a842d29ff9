//! `by` may name a nested field, or a field of a tuple struct, of any `Display` type.

use courier::HandlerError;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    id: u64,
    lines: u32,
}

#[derive(Serialize, Deserialize)]
struct Envelope(Order);

#[derive(Serialize, Deserialize, courier::Message)]
struct OrderPlaced {
    order: Order,
}

#[derive(Serialize, Deserialize, courier::Message)]
struct OrderPaid(u64);

#[derive(Serialize, Deserialize, courier::Message)]
struct OrderShipped {
    shipment: Envelope,
}

#[derive(Default, Serialize, Deserialize)]
struct Fulfilment {
    lines: u32,
}

#[courier::saga]
impl Fulfilment {
    #[start(by = order.id)]
    async fn placed(&mut self, msg: OrderPlaced) -> Result<(), HandlerError> {
        self.lines = msg.order.lines;
        Ok(())
    }

    #[handle(by = 0)]
    async fn paid(&mut self, _msg: OrderPaid) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = shipment.0.id)]
    async fn shipped(&mut self, _msg: OrderShipped) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {
    let _ = courier::Endpoint::builder("orders").saga::<Fulfilment>();
}
