//! A message type at version 3 with an upcaster, a saga state at version 2 with a
//! migration, each a function of the type's own.

use courier::HandlerError;
use courier::UpcastError;
use courier::saga::Saga;
use courier::serde_json::Value;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "shop.OrderPlaced", version = 3, upcast = Self::upcast)]
struct OrderPlaced {
    order: String,
}

impl OrderPlaced {
    fn upcast(from: u32, body: Value) -> Result<Value, UpcastError> {
        match from {
            1 | 2 => Ok(body),
            _ => Err(UpcastError::unsupported(from)),
        }
    }
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Order;

#[courier::saga(name = "shop.Order", version = 2, migrate = Self::migrate)]
impl Order {
    #[start(by = order)]
    async fn placed(&mut self, _msg: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }

    fn migrate(_from: u32, state: Value) -> Result<Value, UpcastError> {
        Ok(state)
    }
}

fn main() {
    assert_eq!(<OrderPlaced as courier::Message>::VERSION, 3);
    assert_eq!(<Order as Saga>::VERSION, 2);
}
