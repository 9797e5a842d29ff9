//! The second argument of a handler is `&mut Context`, not a `Context` by value.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: Tick, ctx: courier::Context) -> Result<(), courier::HandlerError> {
    let _ = ctx;
    Ok(())
}

fn main() {}
