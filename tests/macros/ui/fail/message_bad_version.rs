//! A message's version is an integer from 1, given once; an upcaster is the path of a
//! function and needs a version above 1.

use courier::UpcastError;
use courier::serde_json::Value;

fn upcast(_from: u32, body: Value) -> Result<Value, UpcastError> {
    Ok(body)
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(version = 0)]
struct Zero;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(version = "2")]
struct Text;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(version = 2u8)]
struct Suffixed;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(version = 2, version = 3)]
struct Twice;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(upcast = upcast)]
struct NothingOlder;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(version = 2, upcast = |_, v| Ok(v))]
struct Closure;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(versoin = 2)]
struct Misspelt;

fn main() {}
