//! A misspelt attribute is an error, not silently ignored.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(nme = "x")]
struct Tick;

fn main() {}
