//! A message with a pinned wire name and earlier names, in one attribute or several.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "billing.InvoicePaid", aliases = ["billing.InvoiceSettled", "InvoicePaid"])]
struct InvoicePaid {
    invoice: String,
}

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "shipping.Shipped")]
#[message(aliases = [])]
pub struct Shipped;

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "json.Explicit", codec = courier::JsonCodec)]
struct Explicit(u32);

const _: () = assert!(<InvoicePaid as courier::Message>::ALIASES.len() == 2);
const _: () = assert!(<Shipped as courier::Message>::ALIASES.is_empty());
const _: &str = <Explicit as courier::Message>::NAME;

fn main() {}
