//! `#[handler]` takes no arguments.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler(foo)]
async fn on_tick(_tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {}
