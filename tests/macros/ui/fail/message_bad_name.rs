//! A message name has no whitespace, and an alias does not repeat the name.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "billing Invoice")]
struct Invoice;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "billing.Paid", aliases = ["billing.Paid"])]
struct Paid;

fn main() {}
