//! A message finds its instance one way: by a field or by a header.
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
    #[start(by = user, header = "x-user-id")]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = user, by = user)]
    async fn confirmed(&mut self, _msg: Confirmed) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
