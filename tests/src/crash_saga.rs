//! The saga of the saga crash test: its start requests a timeout an hour later; the
//! timeout counts itself (in an [`Fired`] the endpoint holds as state, when there is one)
//! and completes the instance.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::HandlerError;
use courier::saga::SagaContext;
use serde::{Deserialize, Serialize};

/// Starts instance `id`.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "tests.CrashFlowStart")]
pub struct CrashFlowStart {
    /// The instance.
    pub id: String,
}

/// The hour is up.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "tests.CrashFlowExpired")]
pub struct CrashFlowExpired;

/// How often the timeout handler ran.
#[derive(Debug, Default)]
pub struct Fired(pub AtomicU32);

/// The saga's state.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CrashFlow {
    /// The instance.
    pub id: String,
}

#[courier::saga(name = "tests.CrashFlow")]
impl CrashFlow {
    #[start(by = id)]
    async fn started(&mut self, msg: CrashFlowStart, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.id = msg.id;
        ctx.request_timeout(Duration::from_secs(3600), &CrashFlowExpired)?;
        Ok(())
    }

    #[timeout]
    async fn expired(&mut self, _t: CrashFlowExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if let Ok(fired) = ctx.state::<Arc<Fired>>() {
            fired.0.fetch_add(1, Ordering::SeqCst);
        }
        ctx.complete();
        Ok(())
    }
}
