//! Property tests over the whole row of `courier.message` on the real Postgres (issue 30,
//! "Make the class impossible"): no row a producer that is not Courier can insert stops a
//! queue, hides the messages behind it, sits somewhere no receive looks, or makes a
//! message skip its retry policy.
//!
//! Each case makes fresh entities (a queue, a topic with a subscription, or a queue that
//! requires sessions), inserts ONE generated row into `courier.message` as another program
//! would (any value the schema admits in every column: NULLs, the extremes of every
//! integer, `infinity`, `-infinity`, 4713 BC and 294276 AD, times near the virtual clock's
//! now and near the 100-year horizon, every state, dead, random and live lock holders,
//! empty, 128/129-byte and 1-MiB texts and bodies, properties of any JSON shape, the
//! entity id of the queue, its topic, its subscription or of nothing), then sends a valid
//! message through Courier behind it. A PeekLock receiver (for the session queue:
//! `accept_session(Next)`) takes and completes what it gets; the virtual clock moves 15 s
//! (past one 10-s maintenance period) and it receives again. The oracle:
//!
//! * the INSERT fails with a constraint violation (SQLSTATE class 23; or 54000, a session
//!   id too large for its index: refused), or succeeds;
//! * the valid message is received exactly once, and no receive returns an error;
//! * the odd row, if inserted, was received (and completed), or is dead-lettered (state 3
//!   with a reason and a description), or is in a state Courier explains: scheduled for a
//!   time after now and at most 100 years ahead; deferred (delivery count >= 1) and got by
//!   `receive_deferred` with its sequence number; locked by a live holder until at most
//!   the lock duration + 5 min from now. Anything else (active and unlocked but never
//!   taken, locked for ever, by a gone holder, deferred where no receiver finds it, gone
//!   without being received) fails the case, printed with the row.
//!
//! The second property runs an `Endpoint` (with `transport.store()`) on such a row whose
//! body is a valid message of its handler's type, the handler failing the first K times:
//! the odd message goes through the retry policy (one immediate retry, one delayed retry
//! after 5 s, then the dead-letter queue with `RetriesExhausted`): never more attempts than
//! the policy allows, never a delivery count of 0 seen by the handler, no delayed retry
//! skipped, not dead-lettered while a retry is due (but by the broker: expired, or at its
//! max delivery count), and the valid message beside it is handled once.
//!
//! Each test makes a database of its own (`TestDatabase`) and reuses it, one transport and
//! one virtual clock for all its cases, with new entities per case.
//!
//! Commands (`DATABASE_URL` or a Docker engine for the server):
//!
//! ```text
//! cargo test -p courier-tests --test transport pg_row_property    # 300 + 20 cases, ~10 s
//! COURIER_FUZZ_CASES=20000 cargo test -p courier-tests --test transport \
//!     pg_row_property -- --nocapture                                  # a long run, ~10 min
//! COURIER_ROW_SEED=123 ...        # replays the cases of a seed (each run prints its seed)
//! COURIER_ROW_SURVEY=1 ...        # runs every case and lists the failures by class, with
//!                                 # the shortest row of each, instead of stopping (and
//!                                 # shrinking) at the first
//! ```
//!
//! `COURIER_FUZZ_CASES` sets the number of cases of the first property; the endpoint
//! property runs a fifteenth of it (at least 20).
//!
//! The files:
//!
//! * `row.rs`: the generated row (every column of `courier.message`) and its INSERT;
//! * `strategy.rs`: the generator of rows;
//! * `env.rs`: the environment shared by the cases (database, transport, clock, tally) and
//!   the entities of a case;
//! * `receive.rs`: the receives of a case and what they saw;
//! * `oracle.rs`: the classes of failure, and judging what is left after the receives;
//! * `runner.rs`: running the cases (their number, the seed, shrinking or the survey);
//! * `endpoint.rs`: the endpoint-level property (the handler, the retry policy's check);
//! * this file: the two properties' tests, and one case of the first.
//!
//! `embedded_row_property` uses the generator, the receives, the oracle's classes and the
//! runner, re-exported here.

mod endpoint;
mod env;
mod oracle;
mod receive;
mod row;
mod runner;
mod strategy;

use std::time::Duration;

use courier::Transport;

// What `embedded_row_property` (the same property on the embedded broker) imports from
// here, and what this file uses of it. That test is not always in the crate (at times it
// is kept out of main, on the branch wip/embedded-row-property): without it, some of these
// are unused.
#[allow(
    unused_imports,
    reason = "imported by embedded_row_property, when it is in the crate"
)]
pub(super) use self::{
    oracle::{Failure, Outcome, class, fail},
    receive::{Seen, round, take_deferred},
    row::{Json, Shape, Target, abbreviate},
    runner::{cases, run, runtime},
    strategy::{offset, properties, shape, target, text_value},
};

use endpoint::endpoint_row;
use env::{Case, Env};
use row::Row;
use strategy::row;

/// How far the clock moves between the two receives: past one maintenance period (10 s).
pub(super) const PAST_ONE_PERIOD: Duration = Duration::from_secs(15);
/// The farthest a scheduled message may be due (`100 * 366` days, as `Sender::schedule`).
pub(super) const HORIZON_DAYS: i64 = 100 * 366;
/// How long past the lock duration a live holder's lock may still end.
pub(super) const LOCK_GRACE_MS: i64 = 5 * 60 * 1000;
/// The longest time-to-live a queue may have (100 years).
pub(super) const MAX_TTL: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

// ---------------------------------------------------------------------------------------
// The first property: one case
// ---------------------------------------------------------------------------------------

impl Env {
    /// One case of the row property.
    async fn case(&self, row: &Row) -> Result<Outcome, Vec<Failure>> {
        let case = self.entities(row, "rowprop").await;
        let result = self.case_on(row, &case).await;
        self.drop_entities(&case).await;
        result
    }

    async fn case_on(&self, row: &Row, case: &Case) -> Result<Outcome, Vec<Failure>> {
        let refused = self.insert(row, case).await.map_err(|f| vec![f])?;
        self.send_valid(case, "{}", "rowprop.Valid", row.shape == Shape::Sessions)
            .await
            .map_err(|f| vec![f])?;
        let receiver = self.transport.receiver(&case.path).await.unwrap();
        let mut seen = Seen::default();
        let t = &*self.transport;
        round(t, row.shape, &case.path, &receiver, &case.valid_id, &mut seen).await;
        self.clock.advance(PAST_ONE_PERIOD);
        round(t, row.shape, &case.path, &receiver, &case.valid_id, &mut seen).await;

        let mut failures = std::mem::take(&mut seen.failures);
        match seen.valid {
            1 => {}
            0 => failures.push(fail(class::VALID_MISSING, case.valid_id.clone())),
            n => failures.push(fail(class::VALID_TWICE, format!("{n} times"))),
        }
        let left = self.inspect(case).await;
        let ends = self.judge(row, case, &receiver, &left, &mut failures).await;
        let inserted = refused.is_none();
        if inserted && seen.odd.is_empty() && ends.is_empty() {
            failures.push(fail(class::LOST, "no row is left, and no receive got it"));
        }
        if failures.is_empty() {
            Ok(Outcome {
                refused,
                received: seen.odd.len(),
                ends,
            })
        } else {
            for f in &mut failures {
                f.detail = format!("{}\n      received: {:?}", f.detail, seen.odd);
            }
            Err(failures)
        }
    }
}

/// The property: any row a producer can insert into `courier.message` is refused at INSERT,
/// received, dead-lettered with a reason, or in a state Courier explains, within one
/// maintenance period; the valid message behind it is received exactly once; no receive
/// fails; nothing is lost.
#[test]
fn any_row_is_refused_received_dead_lettered_or_explained_and_the_valid_message_behind_it_is_received_once() {
    let rt = runtime();
    let env = rt.block_on(Env::open());
    let started = std::time::Instant::now();
    let result = run("pg_row_property::any_row", cases(300), row(), |row| {
        let outcome = rt.block_on(env.case(row))?;
        match &outcome.refused {
            Some(code) => env.count(format!("refused at INSERT ({code})")),
            None if outcome.received > 0 => env.count("received"),
            None => {}
        }
        for end in &outcome.ends {
            env.count(*end);
        }
        Ok(())
    });
    eprintln!(
        "pg_row_property::any_row: {:.1} s; outcomes: {:?}",
        started.elapsed().as_secs_f64(),
        env.tally.lock().unwrap()
    );
    rt.block_on(env.close());
    if let Err(report) = result {
        panic!("{report}");
    }
}

/// The property at the endpoint: an odd row the endpoint receives goes through the retry
/// policy (immediate retry, delayed retry after its delay) or to the dead-letter queue
/// with a reason; never more attempts than the policy allows, never a delayed retry
/// skipped, never the valid message blocked.
#[test]
fn a_received_odd_row_goes_through_the_retry_policy_and_never_blocks_the_valid_message() {
    let rt = runtime();
    let env = rt.block_on(Env::open());
    let started = std::time::Instant::now();
    let cases = (cases(300) / 15).max(20);
    let result = run("pg_row_property::endpoint", cases, endpoint_row(), |(row, _)| {
        rt.block_on(env.endpoint_case(row))
    });
    eprintln!(
        "pg_row_property::endpoint: {:.1} s; outcomes: {:?}",
        started.elapsed().as_secs_f64(),
        env.tally.lock().unwrap()
    );
    rt.block_on(env.close());
    if let Err(report) = result {
        panic!("{report}");
    }
}
