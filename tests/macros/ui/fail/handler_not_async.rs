//! A handler must be an `async fn`.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
fn on_tick(_tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {}
