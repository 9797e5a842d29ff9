//! Return types that are not written `Result<T, E>` are checked whole: the error is on
//! the whole return type.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn option(_tick: Tick) -> Option<()> {
    None
}

#[courier::handler]
async fn io_result(_tick: Tick) -> std::io::Result<u32> {
    Ok(0)
}

#[derive(Debug)]
struct NotAnError;

type Outcome = Result<(), NotAnError>;

#[courier::handler]
async fn aliased(_tick: Tick) -> Outcome {
    Ok(())
}

#[courier::handler]
async fn unit(_tick: Tick) -> () {}

fn main() {}
