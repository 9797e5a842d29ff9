//! A message name cannot be empty.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "")]
struct Tick;

fn main() {}
