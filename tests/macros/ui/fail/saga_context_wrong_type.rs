//! The context of a saga handler is a `SagaContext`.
use courier::saga::SagaContext;
use courier::HandlerError;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Registered {
    user: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Confirmed {
    user: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct SignUp {
    confirmed: bool,
}

#[courier::saga]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered, _ctx: &mut courier::Context) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = user)]
    async fn confirmed(&mut self, _msg: Confirmed, _ctx: &SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
