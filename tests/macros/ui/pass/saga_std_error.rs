//! A saga handler may fail with any `std::error::Error + Send + Sync + 'static`, or
//! return an alias of a `Result`.

use courier::saga::SagaContext;

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Upload {
    file: String,
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Scanned {
    file: String,
}

#[derive(Debug, thiserror::Error)]
#[error("the scanner is busy")]
struct Busy;

type Outcome = Result<(), courier::HandlerError>;

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Scan {
    clean: bool,
}

#[courier::saga]
impl Scan {
    #[start(by = file)]
    async fn uploaded(&mut self, _msg: Upload, _ctx: &mut SagaContext<'_>) -> Result<(), std::io::Error> {
        Ok(())
    }

    #[handle(by = file)]
    async fn scanned(&mut self, _msg: Scanned) -> std::result::Result<(), Busy> {
        self.clean = true;
        Ok(())
    }
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
struct Begin {
    id: u32,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Aliased;

#[courier::saga]
impl Aliased {
    #[start(by = id)]
    async fn begin(&mut self, _msg: Begin) -> Outcome {
        Ok(())
    }
}

fn main() {
    let _ = courier::Endpoint::builder("scans").saga::<Scan>().saga::<Aliased>();
}
