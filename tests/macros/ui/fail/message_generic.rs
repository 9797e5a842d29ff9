//! A message type has one fixed wire name, so it cannot be generic.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Wrapper<T> {
    inner: T,
}

fn main() {}
