//! Every `by` field of a saga has one type: the error is on the field that differs.
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
    account: u64,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Removed {
    who: String,
}

#[courier::saga]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = user)]
    async fn confirmed(&mut self, _msg: Confirmed) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(by = account)]
    async fn activated(&mut self, _msg: Activated) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(header = "x-user-id")]
    async fn removed(&mut self, _msg: Removed) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
