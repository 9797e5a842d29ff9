//! The first argument of a handler must be a message type.

#[courier::handler]
async fn on_text(text: String, _ctx: &mut courier::Context) -> Result<(), courier::HandlerError> {
    let _ = text;
    Ok(())
}

fn main() {}
