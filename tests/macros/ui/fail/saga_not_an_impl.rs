//! `#[saga]` goes on an impl block, not on a struct or a function.
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
struct Other {
    done: bool,
}

#[courier::saga]
async fn registered(_msg: Registered) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
