//! Every message of a saga may find its instance by a header, the start included.

use courier::saga::SagaContext;
use courier::HandlerError;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct CartOpened;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct ItemAdded {
    sku: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Cart {
    items: Vec<String>,
}

#[courier::saga]
impl Cart {
    #[start(header = "x-cart-id")]
    async fn opened(&mut self, _msg: CartOpened, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(header = "x-cart-id")]
    async fn item_added(&mut self, msg: ItemAdded, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.items.push(msg.sku);
        Ok(())
    }
}

fn main() {
    let _ = courier::Endpoint::builder("carts").saga::<Cart>();
}
