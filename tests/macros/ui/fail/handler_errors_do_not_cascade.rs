//! A handler with a wrong signature reports that, and nothing more: its registration
//! and the uses of its name add no errors of their own.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
fn on_tick(_tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

#[courier::handler(retries = 3)]
async fn on_tock(_tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {
    let _ = courier::Endpoint::builder("x").handler(on_tick).handler(on_tock);
}
