//! The name is given once.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "a.Tick")]
#[message(name = "b.Tick")]
struct Tick;

fn main() {}
