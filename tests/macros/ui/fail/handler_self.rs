//! A handler is a free function: no `self`.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

struct Service;

impl Service {
    #[courier::handler]
    async fn on_tick(&self, _tick: Tick) -> Result<(), courier::HandlerError> {
        Ok(())
    }
}

fn main() {}
