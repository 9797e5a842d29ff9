//! A handler owns the message it handles: it takes it by value.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: &Tick, _ctx: &mut courier::Context) -> Result<(), courier::HandlerError> {
    Ok(())
}

#[courier::handler]
async fn on_any(_msg: impl courier::Message) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {}
