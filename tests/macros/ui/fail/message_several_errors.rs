//! Every mistake in the attributes is reported at once.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "", aliases = "x")]
#[message(colour = "blue")]
struct Wrapper<T>(T);

fn main() {}
