//! A handler behind a `cfg` that is off disappears whole, impl included; other
//! attributes stay on the function.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Tick;

#[courier::handler]
#[cfg(any())]
async fn compiled_out(_tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

#[courier::handler]
#[cfg(all())]
#[allow(unused_variables)]
async fn compiled_in(tick: Tick) -> Result<(), courier::HandlerError> {
    Ok(())
}

fn main() {
    let _ = courier::Endpoint::builder("x").handler(compiled_in);
}
