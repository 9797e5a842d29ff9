//! The second argument of a handler is `&mut Context`, not a reference to something else.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: Tick, state: &mut String) -> Result<(), courier::HandlerError> {
    state.push('x');
    Ok(())
}

fn main() {}
