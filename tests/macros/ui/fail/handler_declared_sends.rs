//! `sends` and `publishes` take message types in parentheses; anything else is named.
use courier::{Context, HandlerError};

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Charge;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Refund;

#[courier::handler(sends = Refund)]
async fn one(_msg: Charge, _ctx: &mut Context) -> Result<(), HandlerError> {
    Ok(())
}

#[courier::handler(sends())]
async fn two(_msg: Charge, _ctx: &mut Context) -> Result<(), HandlerError> {
    Ok(())
}

#[courier::handler(retries = 3)]
async fn three(_msg: Charge, _ctx: &mut Context) -> Result<(), HandlerError> {
    Ok(())
}

#[courier::handler(sends(String))]
async fn four(_msg: Charge, _ctx: &mut Context) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
