//! `upcast = Self::upcast` with no function `upcast` of the type's own names the
//! generated function itself, which would call itself forever.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(version = 2, upcast = Self::upcast)]
struct Forgotten;

fn main() {}
