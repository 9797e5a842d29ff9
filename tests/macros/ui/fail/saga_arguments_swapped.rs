//! The message and the context written the wrong way round: one error that says so.
use courier::saga::SagaContext;
use courier::HandlerError;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Registered {
    user: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct SignUp;

#[courier::saga]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, ctx: &mut SagaContext<'_>, msg: Registered) -> Result<(), HandlerError> {
        let _ = (ctx, msg);
        Ok(())
    }
}

fn main() {}
