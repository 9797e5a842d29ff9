//! Every mistake in a handler's signature is reported at once.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
fn on_tick(_tick: Tick) {}

#[courier::handler]
fn on_nothing(_tick: Tick, ctx: courier::Context, extra: u32) -> u32 {
    let _ = (ctx, extra);
    0
}

fn main() {}
