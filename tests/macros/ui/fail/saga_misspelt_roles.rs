//! `#[starts]`, `#[handles]`, `#[timeouts]`, `#[notfound]`: each suggests the role it
//! looks like, instead of rustc's "cannot find attribute".
use courier::saga::SagaContext;
use courier::{Context, HandlerError};

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Registered {
    user: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Confirmed {
    user: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Expired;

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct SignUp;

#[courier::saga]
impl SignUp {
    #[starts(by = user)]
    async fn registered(&mut self, _msg: Registered, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handles(by = user)]
    async fn confirmed(&mut self, _msg: Confirmed, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[timeouts]
    async fn expired(&mut self, _msg: Expired, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Ok(())
    }

    #[notfound]
    async fn late(_msg: Confirmed, _ctx: &mut Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
