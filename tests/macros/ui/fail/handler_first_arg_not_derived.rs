//! A serde type without `#[derive(courier::Message)]` is not a message.

#[derive(serde::Serialize, serde::Deserialize)]
struct OrderPlaced {
    id: u64,
}

#[courier::handler]
async fn on_order_placed(msg: OrderPlaced) -> Result<(), courier::HandlerError> {
    let _ = msg.id;
    Ok(())
}

fn main() {}
