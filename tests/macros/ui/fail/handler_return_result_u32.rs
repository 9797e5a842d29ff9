//! A handler returns `Result<(), E>`: the success value must be `()`.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: Tick) -> Result<u32, std::io::Error> {
    Ok(0)
}

fn main() {}
