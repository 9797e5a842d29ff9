//! A handler must return a `Result`.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: Tick) {}

fn main() {}
