//! An upcaster has the type `fn(u32, Value) -> Result<Value, UpcastError>`.

use courier::serde_json::Value;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(version = 2, upcast = Self::from_v1)]
struct WrongType;

impl WrongType {
    fn from_v1(body: Value) -> Value {
        body
    }
}

fn main() {}
