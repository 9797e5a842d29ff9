//! Saga and timeout metrics, on the `courier::testing` harness (the real runtime, an
//! embedded broker and store, virtual time).

use std::time::Duration;

use courier::observability::{labels, names};
use courier::saga::SagaContext;
use courier::testing::TestEndpoint;
use courier::{HandlerError, Routes};
use serde::{Deserialize, Serialize};

use crate::recorder::{Series, series_of};

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "obs.Opened")]
struct Opened {
    account: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "obs.Closed")]
struct Closed {
    account: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "obs.Expired")]
struct Expired;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Account {
    account: String,
}

#[courier::saga(name = "obs.Account")]
impl Account {
    #[start(by = account)]
    async fn opened(&mut self, msg: Opened, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.account = msg.account;
        ctx.request_timeout(Duration::from_secs(600), &Expired)?;
        Ok(())
    }

    #[handle(by = account)]
    async fn closed(&mut self, _msg: Closed, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.cancel_timeout::<Expired>();
        ctx.complete();
        Ok(())
    }

    #[timeout]
    async fn expired(&mut self, _t: Expired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }
}

fn counter(series: &[Series], metric: &str) -> u64 {
    series
        .iter()
        .filter_map(|s| match s {
            Series::Counter { name, labels, value } if name == metric => {
                assert!(
                    labels.contains(&(labels::SAGA_TYPE.to_owned(), "obs.Account".to_owned())),
                    "{metric} is labelled with the saga type: {labels:?}"
                );
                Some(*value)
            }
            _ => None,
        })
        .sum()
}

#[tokio::test]
async fn saga_instances_and_timeouts_are_counted_once_committed() {
    crate::recorder::install();
    let name = "obs-saga";
    let t = TestEndpoint::start(name, |e| e.routes(Routes::new()).saga::<Account>())
        .await
        .unwrap();
    t.send(&Opened { account: "a".into() }).await.unwrap();
    t.send(&Opened { account: "b".into() }).await.unwrap();
    t.send(&Closed { account: "b".into() }).await.unwrap();
    t.send(&Closed {
        account: "nobody".into(),
    })
    .await
    .unwrap();
    t.advance(Duration::from_secs(600)).await.unwrap();
    t.settle().await.unwrap();
    t.shutdown().await.unwrap();

    let series = series_of(name);
    assert_eq!(counter(&series, names::SAGAS_STARTED), 2);
    assert_eq!(counter(&series, names::SAGAS_COMPLETED), 2, "b closed, a expired");
    assert_eq!(counter(&series, names::SAGAS_NOT_FOUND), 1);
    assert_eq!(counter(&series, names::SAGA_CONFLICTS), 0);
    assert_eq!(counter(&series, names::TIMEOUTS_REQUESTED), 2);
    assert_eq!(counter(&series, names::TIMEOUTS_CANCELLED), 1);
    assert_eq!(counter(&series, names::TIMEOUTS_FIRED), 1, "b's expiry was cancelled");
    let lateness: Vec<f64> = series
        .iter()
        .filter_map(|s| match s {
            Series::Histogram { name, values, .. } if name == names::TIMEOUT_LATENESS => Some(values.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(lateness.len(), 1);
    assert!(
        (0.0..1.0).contains(&lateness[0]),
        "fired at its due time by the virtual clock: {lateness:?}"
    );
}
