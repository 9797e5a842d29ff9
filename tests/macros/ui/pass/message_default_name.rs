//! A message with the default wire name: the Rust path of the type.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, courier::Message)]
struct OrderPlaced {
    id: u64,
}

#[derive(Serialize, Deserialize, courier::Message)]
struct Ping;

#[derive(Serialize, Deserialize, courier::Message)]
enum Command {
    Start,
    Stop { reason: String },
}

const _: &str = <OrderPlaced as courier::Message>::NAME;
const _: &str = <Ping as courier::Message>::NAME;
const _: &str = <Command as courier::Message>::NAME;

fn main() {}
