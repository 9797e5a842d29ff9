//! A handler takes the message and the context, nothing more.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: Tick, _ctx: &mut courier::Context, extra: u32) -> Result<(), courier::HandlerError> {
    let _ = extra;
    Ok(())
}

fn main() {}
