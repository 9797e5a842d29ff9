//! The message of a saga handler is a Courier message.
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

#[derive(serde::Serialize, serde::Deserialize)]
struct NotDerived {
    user: String,
}

#[courier::saga]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = user)]
    async fn not_derived(&mut self, _msg: NotDerived) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(header = "x-user-id")]
    async fn text(&mut self, _msg: String) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
