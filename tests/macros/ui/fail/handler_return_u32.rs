//! A handler returns `Result<(), E>`, not a number.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: Tick) -> u32 {
    0
}

fn main() {}
