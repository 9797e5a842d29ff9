//! Generated handlers register on an endpoint builder by their function's name.

use courier::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "orders.Placed")]
struct OrderPlaced {
    id: u64,
}

#[derive(Serialize, Deserialize, courier::Message)]
struct OrderShipped;

#[handler]
async fn on_placed(_msg: OrderPlaced, _ctx: &mut Context) -> Result<(), HandlerError> {
    Ok(())
}

#[courier::handler]
async fn on_shipped(_msg: OrderShipped) -> Result<(), std::io::Error> {
    Ok(())
}

mod inner {
    /// A handler in another module, visible outside it.
    #[courier::handler]
    pub(crate) async fn also_on_placed(_msg: super::OrderPlaced) -> Result<(), courier::HandlerError> {
        Ok(())
    }
}

fn main() {
    let _ = courier::Endpoint::builder("x")
        .handler(on_placed)
        .handler(on_shipped)
        .handler(inner::also_on_placed);
}
