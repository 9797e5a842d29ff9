//! A handler handles one message type: it cannot be generic.

#[courier::handler]
async fn on_any<M: courier::Message>(_msg: M) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {}
