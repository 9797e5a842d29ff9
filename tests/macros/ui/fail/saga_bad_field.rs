//! A `by` field must exist on the message, and write itself as text.
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
struct Activated {
    user: Option<String>,
}

#[courier::saga]
impl SignUp {
    #[start(by = user_id)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = user.name)]
    async fn confirmed(&mut self, _msg: Confirmed) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = user)]
    async fn activated(&mut self, _msg: Activated) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
