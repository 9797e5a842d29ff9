//! A not-found handler has no state (no `self`), takes no arguments in its attribute, and
//! `property` finds a continuing message's instance only.
use courier::saga::SagaContext;
use courier::{Context, HandlerError};

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Registered {
    user: String,
    payment: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Paid {
    payment: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct SignUp;

#[courier::saga]
impl SignUp {
    #[start(by = payment, property = "payment")]
    async fn registered(&mut self, _msg: Registered, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(property = "payment")]
    async fn paid(&mut self, _msg: Paid, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[not_found(by = payment)]
    async fn late(&mut self, _msg: Paid, _ctx: &mut Context) -> Result<(), HandlerError> {
        Ok(())
    }
}



/// A not-found handler for a message the saga starts with, and one for a message it
/// does not handle.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Checkout;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Refunded {
    payment: String,
}

#[courier::saga]
impl Checkout {
    #[start(by = payment)]
    async fn paid(&mut self, _msg: Paid, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[not_found]
    async fn paid_late(_msg: Paid, _ctx: &mut Context) -> Result<(), HandlerError> {
        Ok(())
    }

    #[not_found]
    async fn refunded_late(_msg: Refunded, _ctx: &mut Context) -> Result<(), HandlerError> {
        Ok(())
    }
}
fn main() {}
