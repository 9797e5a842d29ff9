//! A saga handler changes the state: it takes `&mut self`.
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

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Removed {
    user: String,
}

#[courier::saga]
impl SignUp {
    #[start(by = user)]
    async fn registered(&self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = user)]
    async fn confirmed(self, _msg: Confirmed) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = user)]
    async fn removed(_msg: Removed, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
