//! `aliases` takes a list, even of one name.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(aliases = "x")]
struct Tick;

fn main() {}
