//! Handlers and messages declared by a `macro_rules!` macro: the generated code does not
//! depend on where the tokens come from.

macro_rules! declare {
    ($msg:ident, $handler:ident, $ret:ty) => {
        #[derive(serde::Serialize, serde::Deserialize, courier::Message)]
        #[message(name = "generated")]
        struct $msg;

        #[courier::handler]
        async fn $handler(message: $msg, ctx: &mut courier::Context) -> $ret {
            let _ = (message, ctx);
            Ok(())
        }
    };
}

declare!(Tick, on_tick, Result<(), courier::HandlerError>);

type Outcome = Result<(), std::io::Error>;
declare!(Tock, on_tock, Outcome);

fn main() {
    let _ = courier::Endpoint::builder("x").handler(on_tick).handler(on_tock);
}
