//! Unknown arguments of `#[saga]` and of the handler attributes, with a suggestion when one is close.
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

#[courier::saga(nme = "accounts.SignUp")]
impl SignUp {
    #[start(bye = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(headr = "x-user-id")]
    async fn confirmed(&mut self, _msg: Confirmed) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Other;

#[courier::saga(retries = 3)]
impl Other {
    #[start(key = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
