//! A message with a wrong attribute reports that, and nothing more: its uses as a
//! message add no errors of their own.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "")]
struct Tick;

#[courier::handler]
async fn on_tick(_tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {
    let _ = <Tick as courier::Message>::to_envelope(&Tick);
}
