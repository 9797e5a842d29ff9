//! The full handler shape: the message, the context, and `Result<(), HandlerError>`.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, courier::Message)]
pub struct OrderPlaced {
    pub id: u64,
}

/// Documented handlers keep their docs on the generated struct.
#[courier::handler]
async fn on_order_placed(msg: OrderPlaced, ctx: &mut courier::Context) -> Result<(), courier::HandlerError> {
    let _ = (msg.id, ctx);
    Ok(())
}

#[courier::handler]
pub async fn fails(_msg: OrderPlaced, _ctx: &mut courier::Context) -> Result<(), courier::HandlerError> {
    Err(courier::HandlerError::msg("no"))
}

fn assert_handler<H: courier::Handler<Message = OrderPlaced>>(_: H) {}

fn main() {
    assert_handler(on_order_placed);
    assert_handler(fails);
}
