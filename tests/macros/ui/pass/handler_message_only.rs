//! A handler that does not need the context takes only the message.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {
    let _: &dyn courier::Handler<Message = Tick> = &on_tick;
}
