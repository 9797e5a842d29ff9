//! The state of a saga is `Default` (a start creates it), `Serialize` and `Deserialize`:
//! the error is on the state type.

use courier::HandlerError;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Registered {
    user: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SignUp {
    confirmed: bool,
}

#[courier::saga]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        self.confirmed = false;
        Ok(())
    }
}

fn main() {}
