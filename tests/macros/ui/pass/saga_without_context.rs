//! A saga handler may leave the context out, and be written `self: &mut Self`.

use courier::HandlerError;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Ping {
    id: u64,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Pong {
    id: u64,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Rally {
    hits: u32,
}

#[courier::saga]
impl Rally {
    #[start(by = id)]
    async fn ping(&mut self, _msg: Ping) -> Result<(), HandlerError> {
        self.hits += 1;
        Ok(())
    }

    #[handle(by = id)]
    async fn pong(self: &mut Self, _msg: Pong) -> Result<(), HandlerError> {
        self.hits += 1;
        Ok(())
    }
}

fn main() {
    let _ = courier::Endpoint::builder("rally").saga::<Rally>();
}
