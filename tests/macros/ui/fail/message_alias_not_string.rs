//! Each alias is a string literal.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(aliases = ["ok.Name", 3, old::Name])]
struct Tick;

fn main() {}
