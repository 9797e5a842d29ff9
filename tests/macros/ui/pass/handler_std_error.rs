//! A handler may return any std error type; `?` works on it inside, and the macro
//! converts it into a `HandlerError`.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, courier::Message)]
struct FileWritten {
    path: String,
}

#[courier::handler]
async fn on_file_written(msg: FileWritten, _ctx: &mut courier::Context) -> Result<(), std::io::Error> {
    let _ = std::fs::metadata(&msg.path)?;
    Ok(())
}

#[derive(Debug)]
struct MyError;

impl std::fmt::Display for MyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("my error")
    }
}

impl std::error::Error for MyError {}

#[courier::handler]
async fn custom_error(_msg: FileWritten) -> Result<(), MyError> {
    Err(MyError)
}

/// A type alias of a `Result` is fine too.
type HandlerResult = Result<(), courier::HandlerError>;

#[courier::handler]
async fn aliased(_msg: FileWritten) -> HandlerResult {
    Ok(())
}

fn main() {}
