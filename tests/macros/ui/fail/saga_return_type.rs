//! A saga handler returns `Result<(), E>` with an `E` that converts into `HandlerError`.
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
    user: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Removed {
    user: String,
}

struct NotAnError;

#[courier::saga]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) {}

    #[handle(by = user)]
    async fn confirmed(&mut self, _msg: Confirmed) -> Result<u32, HandlerError> {
        Ok(1)
    }

    #[handle(by = user)]
    async fn activated(&mut self, _msg: Activated) -> Result<(), NotAnError> {
        Ok(())
    }

    #[handle(by = user)]
    async fn removed(&mut self, _msg: Removed) -> bool {
        true
    }
}

fn main() {}
