//! A pinned saga name is a non-empty string literal.

use courier::HandlerError;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Registered {
    user: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct SignUp;

#[courier::saga(name = "")]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Login;

#[courier::saga(name = accounts.Login)]
impl Login {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
