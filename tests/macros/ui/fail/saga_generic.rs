//! A saga cannot be generic.
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

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Workflow<T> {
    state: T,
}

#[courier::saga]
impl<T: Default> Workflow<T> {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
