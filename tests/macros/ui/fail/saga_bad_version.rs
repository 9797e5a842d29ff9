//! A saga's state version is an integer from 1; `migrate` needs a version above 1 and is
//! the path of a function.

use courier::HandlerError;
use courier::UpcastError;
use courier::serde_json::Value;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Registered {
    user: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct SignUp;

#[courier::saga(name = "accounts.SignUp", version = 0)]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Login;

#[courier::saga(migrate = Self::migrate)]
impl Login {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }

    fn migrate(_from: u32, state: Value) -> Result<Value, UpcastError> {
        Ok(state)
    }
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Logout;

#[courier::saga(version = two, migrate = "Self::migrate", verison = 3)]
impl Logout {
    #[start(by = user)]
    async fn registered(&mut self, _msg: Registered) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
