//! The workflow every chaos run drives: one `Flow` saga per business key, a handler in
//! between, a timeout that fires or is cancelled, and an effect row written through
//! `ctx.transaction()` at each step, so that a step done twice shows as two rows.
//!
//! For a key `k` the driver sends `Open { key: k, cancel }` (message id `open-k`):
//! - the saga starts: effect `open`, a `Deadline` timeout, `Work` sent;
//! - the handler of `Work`: effect `work`, `Worked` sent;
//! - the saga on `Worked`: effect `worked`; when `cancel`, the timeout is cancelled and
//!   the saga completes (the `Deadline` is an hour away and must never fire);
//! - otherwise the `Deadline` (a couple of seconds) fires: effect `deadline`, complete.
//!   Should it fire before `Worked` came (a long outage), it writes `early` and asks
//!   again: that row is counted, not checked, since outages decide how many there are.

use std::time::Duration;

use courier::prelude::*;
use courier::saga::SagaContext;
use serde::{Deserialize, Serialize};

/// How long a `Deadline` waits for a key that is not cancelled, and for one that is.
pub const FIRES_AFTER: Duration = Duration::from_secs(2);
const CANCELLED_LONG_BEFORE: Duration = Duration::from_secs(3600);
/// How long a `Deadline` that came before `Worked` waits again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// The steps whose effect each key must show exactly once (`deadline` only for keys that
/// are not cancelled).
pub const STEPS: [&str; 4] = ["open", "work", "worked", "deadline"];

/// Which SQL the effect rows are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sql {
    /// A Postgres store.
    Postgres,
    /// A SQLite store (of its own, or the embedded broker's file).
    Sqlite,
}

impl Sql {
    /// The effects table, made by the driver before any worker starts.
    pub fn create_effects(self) -> &'static str {
        match self {
            Sql::Postgres => "CREATE TABLE IF NOT EXISTS chaos_effects (key TEXT NOT NULL, step TEXT NOT NULL)",
            Sql::Sqlite => "CREATE TABLE IF NOT EXISTS chaos_effects (key TEXT NOT NULL, step TEXT NOT NULL)",
        }
    }
}

/// Opens the flow of one key.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "chaos.Open")]
pub struct Open {
    /// The business key (`k-000042`).
    pub key: String,
    /// Whether the flow cancels its timeout and ends before it fires.
    pub cancel: bool,
}

/// The work between the saga's two steps.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "chaos.Work")]
pub struct Work {
    /// The key.
    pub key: String,
}

/// The work was done.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "chaos.Worked")]
pub struct Worked {
    /// The key.
    pub key: String,
}

/// The flow's timeout.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "chaos.Deadline")]
pub struct Deadline;

/// The routes of a chaos endpoint named `queue`: everything comes back to it.
pub fn routes(queue: &str) -> Routes {
    Routes::new()
        .send::<Open>(queue)
        .send::<Work>(queue)
        .send::<Worked>(queue)
}

/// Writes the effect of `step` for `key` in the handling's transaction.
async fn effect(ctx: &mut Context, key: &str, step: &str) -> Result<(), HandlerError> {
    match *ctx.state::<Sql>()? {
        Sql::Postgres => {
            let tx = ctx.transaction::<sqlx::Postgres>()?;
            sqlx::query("INSERT INTO chaos_effects (key, step) VALUES ($1, $2)")
                .bind(key)
                .bind(step)
                .execute(&mut *tx)
                .await?;
        }
        Sql::Sqlite => {
            let tx = ctx.transaction::<sqlx::Sqlite>()?;
            sqlx::query("INSERT INTO chaos_effects (key, step) VALUES (?1, ?2)")
                .bind(key)
                .bind(step)
                .execute(&mut *tx)
                .await?;
        }
    }
    Ok(())
}

/// One key's flow.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Flow {
    key: String,
    cancel: bool,
    worked: bool,
}

#[courier::saga(name = "chaos.Flow", sends(Work))]
impl Flow {
    #[start(by = key)]
    async fn opened(&mut self, msg: Open, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        effect(ctx, &msg.key, "open").await?;
        let after = if msg.cancel { CANCELLED_LONG_BEFORE } else { FIRES_AFTER };
        ctx.request_timeout(after, &Deadline)?;
        // Fixed ids: a lost message can be followed through the logs by its key.
        let id = SendOptions::new().message_id(format!("work-{}", msg.key));
        ctx.send_with(&Work { key: msg.key.clone() }, id)?;
        self.key = msg.key;
        self.cancel = msg.cancel;
        Ok(())
    }

    #[handle(by = key)]
    async fn worked(&mut self, msg: Worked, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        effect(ctx, &msg.key, "worked").await?;
        self.worked = true;
        if self.cancel {
            ctx.cancel_timeout::<Deadline>();
            ctx.complete();
        }
        Ok(())
    }

    #[timeout]
    async fn deadline(&mut self, _t: Deadline, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        let key = self.key.clone();
        if self.worked {
            effect(ctx, &key, "deadline").await?;
            ctx.complete();
        } else {
            effect(ctx, &key, "early").await?;
            ctx.request_timeout(ASK_AGAIN_AFTER, &Deadline)?;
        }
        Ok(())
    }
}

/// The work between the saga's steps.
#[courier::handler(sends(Worked))]
pub async fn work(msg: Work, ctx: &mut Context) -> Result<(), HandlerError> {
    effect(ctx, &msg.key, "work").await?;
    let id = SendOptions::new().message_id(format!("worked-{}", msg.key));
    ctx.send_with(&Worked { key: msg.key }, id)?;
    Ok(())
}

/// The key of flow `n`, and whether it cancels its timeout (every other one).
pub fn key(n: u64) -> (String, bool) {
    (format!("k-{n:06}"), n.is_multiple_of(2))
}
