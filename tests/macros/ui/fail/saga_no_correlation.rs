//! A start or a continuation must say how its message finds the instance.
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
    #[start]
    async fn registered(&mut self, _msg: Registered, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle()]
    async fn confirmed(&mut self, _msg: Confirmed) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
