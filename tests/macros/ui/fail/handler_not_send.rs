//! A handler's future must be `Send`: it runs on the endpoint's worker tasks.

use std::rc::Rc;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

async fn later() {}

#[courier::handler]
async fn on_tick(_tick: Tick) -> Result<(), courier::HandlerError> {
    let shared = Rc::new(1);
    later().await;
    let _ = shared;
    Ok(())
}

fn main() {}
