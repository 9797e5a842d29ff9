//! The message and the context written the wrong way round: one error that says so.
use courier::{Context, HandlerError};

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct ChargeCard {
    order: u64,
}

#[courier::handler]
async fn charge(ctx: &mut Context, msg: ChargeCard) -> Result<(), HandlerError> {
    let _ = (ctx, msg);
    Ok(())
}

fn main() {}
