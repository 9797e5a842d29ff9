//! The error type of a handler must convert into `HandlerError`.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[derive(Debug)]
struct NotAnError;

#[courier::handler]
async fn on_tick(_tick: Tick) -> Result<(), NotAnError> {
    Err(NotAnError)
}

fn main() {}
