//! A public handler of a private message type: the error is on the message type.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
pub async fn on_tick(_tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {}
