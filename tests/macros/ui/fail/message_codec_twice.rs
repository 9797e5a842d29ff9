//! The codec and the aliases are each given once per name.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(codec = courier::JsonCodec, aliases = ["a.Old", "a.Old"])]
#[message(codec = courier::JsonCodec)]
#[message(alias = ["b.Old"])]
struct Tick;

fn main() {}
