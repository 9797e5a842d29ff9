//! The name is a string literal.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = Tick)]
struct Tick;

fn main() {}
