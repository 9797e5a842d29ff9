//! `#[saga(name = "...")]` pins the stored name; a saga in a nested module, behind a
//! `cfg`, with its handlers behind `cfg`s of their own, and with other attributes kept.

mod accounts {
    use courier::HandlerError;

    #[derive(serde::Serialize, serde::Deserialize, courier::Message)]
    pub(crate) struct Registered {
        pub(crate) user: String,
    }

    #[derive(serde::Serialize, serde::Deserialize, courier::Message)]
    #[allow(dead_code)]
    pub(crate) struct Removed {
        pub(crate) user: String,
    }

    #[derive(Default, serde::Serialize, serde::Deserialize)]
    pub(crate) struct SignUp {
        active: bool,
    }

    #[courier::saga(name = "accounts.SignUp")]
    #[cfg(all())]
    impl SignUp {
        #[start(by = user)]
        #[allow(unused_variables)]
        pub(crate) async fn registered(&mut self, msg: Registered) -> Result<(), HandlerError> {
            self.active = true;
            Ok(())
        }

        #[handle(by = user)]
        #[cfg(any())]
        async fn removed(&mut self, _msg: Removed) -> Result<(), HandlerError> {
            compile_error!("compiled out")
        }
    }
}

fn main() {
    assert_eq!(<accounts::SignUp as courier::saga::Saga>::NAME, "accounts.SignUp");
    let _ = courier::Endpoint::builder("accounts").saga::<accounts::SignUp>();
}
