//! One message type, two handlers: which correlation would find the instance?
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
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(header = "x-user-id")]
    async fn registered_again(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
