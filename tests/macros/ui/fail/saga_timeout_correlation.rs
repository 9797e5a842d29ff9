//! A timeout finds its instance by itself: it takes no correlation.
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
struct Expired {
    user: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Reminder;

#[courier::saga]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    #[timeout(by = user)]
    async fn expired(&mut self, _msg: Expired) -> Result<(), HandlerError> {
        Ok(())
    }

    #[timeout(header = "x-user-id")]
    async fn remind(&mut self, _msg: Reminder) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
