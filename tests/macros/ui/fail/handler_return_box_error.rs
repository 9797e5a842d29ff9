//! Known limitation: `courier::BoxError` (`Box<dyn Error + Send + Sync>`) is no
//! `std::error::Error`, so it does not convert into `HandlerError` and cannot be a
//! handler's error type; the compiler's message is about `Sized`. Map the error with
//! `HandlerError::transient` (or `permanent`) and return `Result<(), HandlerError>`.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn boxed(_tick: Tick) -> Result<(), courier::BoxError> {
    Ok(())
}

fn main() {}
