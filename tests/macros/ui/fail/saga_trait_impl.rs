//! `#[saga]` goes on an inherent impl block, not on a trait impl.

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

trait Workflow {
    fn registered(&mut self, msg: Registered);
}

#[courier::saga]
impl Workflow for SignUp {
    #[start(by = user)]
    fn registered(&mut self, _msg: Registered) {}
}

fn main() {}
