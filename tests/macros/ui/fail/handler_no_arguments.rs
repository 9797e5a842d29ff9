//! A handler needs the message as its first argument.

#[courier::handler]
async fn on_nothing() -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {}
