//! The endpoint-level property: an `Endpoint` (with `transport.store()`) on an odd row whose
//! body is a valid `Job`, its handler failing the first K times; the attempts it saw are
//! checked against the retry policy, and what is left is judged by the oracle.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::recoverability::RetryPolicy;
use courier::{Clock, Context, Endpoint, HandlerError, Transport};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use super::env::{Case, Env};
use super::oracle::{Failure, Found, class, fail};
use super::row::{Body, Holder, Json, Row, Session, Shape, Target, Text, Time};
use super::strategy::{properties, row};

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "rowprop.Job")]
struct Job {
    /// 0: the valid message; 1: the odd row.
    n: i64,
    /// How many of its first attempts fail.
    fail: u32,
}

/// One call of the handler.
#[derive(Debug, Clone)]
struct Attempt {
    n: i64,
    at: DateTime<Utc>,
    delivery_count: u32,
    delayed: u32,
    ok: bool,
}

#[derive(Clone, Default)]
struct Probe(Arc<Mutex<Vec<Attempt>>>);

impl Probe {
    fn of(&self, n: i64) -> Vec<Attempt> {
        self.0.lock().unwrap().iter().filter(|a| a.n == n).cloned().collect()
    }
}

#[courier::handler]
async fn handle_job(job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
    let probe = ctx.state::<Probe>()?.clone();
    let mut all = probe.0.lock().unwrap();
    let before = all.iter().filter(|a| a.n == job.n).count();
    let ok = before >= usize::try_from(job.fail).unwrap_or(usize::MAX);
    all.push(Attempt {
        n: job.n,
        at: ctx.clock().now(),
        delivery_count: ctx.delivery_count(),
        delayed: ctx.delayed_retries(),
        ok,
    });
    drop(all);
    if ok {
        Ok(())
    } else {
        Err(HandlerError::msg("fails on purpose"))
    }
}

/// The endpoint's policy: one immediate retry, one delayed retry after 5 s (4 attempts).
const DELAY: Duration = Duration::from_secs(5);

fn policy() -> RetryPolicy {
    RetryPolicy::none().immediate(1).delayed([DELAY])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Immediate,
    Delayed,
    Exhausted,
}

/// What the policy decides after a failed attempt (as `RetryPolicy::decide`).
fn decide(a: &Attempt) -> Decision {
    let p = policy();
    if a.delivery_count <= p.immediate_retries {
        Decision::Immediate
    } else if usize::try_from(a.delayed).unwrap_or(usize::MAX) < p.delayed_retries.len() {
        Decision::Delayed
    } else {
        Decision::Exhausted
    }
}

/// The odd message's attempts against the policy, and where it ended (`left`, the rows of
/// the case): one that failed its last attempt with a retry to come may be dead-lettered
/// only by the broker (expired, or at the queue's max delivery count), never before.
fn check_attempts(attempts: &[Attempt], left: &[Found], max_delivery_count: u32, failures: &mut Vec<Failure>) {
    let shown = || format!("{attempts:?}");
    if attempts.len() > usize::try_from(policy().max_attempts()).unwrap() {
        failures.push(fail(class::RETRIED_BEYOND, shown()));
    }
    if attempts.iter().any(|a| a.delivery_count == 0) {
        failures.push(fail(class::SEEN_COUNT_ZERO, shown()));
    }
    if let Some(last) = attempts.last().filter(|a| !a.ok)
        && decide(last) != Decision::Exhausted
    {
        for f in left.iter().filter(|f| !f.is_valid && f.state == 3) {
            let by_the_broker = match f.dl_reason.as_deref() {
                Some(courier::reasons::TTL_EXPIRED) => true,
                Some(courier::reasons::MAX_DELIVERY_COUNT_EXCEEDED) => last.delivery_count >= max_delivery_count,
                _ => false,
            };
            if !by_the_broker {
                failures.push(fail(class::DEAD_BEFORE_POLICY, format!("{}; {}", f.shown, shown())));
            }
        }
    }
    for pair in attempts.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.ok {
            failures.push(fail(class::HANDLED_TWICE, shown()));
            break;
        }
        match decide(a) {
            Decision::Immediate => {}
            Decision::Delayed => {
                let waited = b.at - a.at;
                if waited < chrono::Duration::from_std(DELAY).unwrap() || b.delayed != a.delayed + 1 {
                    failures.push(fail(class::DELAY_SKIPPED, shown()));
                    break;
                }
            }
            Decision::Exhausted => {
                failures.push(fail(class::AFTER_EXHAUSTED, shown()));
                break;
            }
        }
    }
}

/// A row as `courier.send` writes it: what the endpoint property starts from.
fn plain() -> Row {
    let none = || Text(None);
    Row {
        shape: Shape::Queue,
        max_delivery_count: 10,
        default_ttl: None,
        target: Target::Receiving,
        seq: None,
        state: Some(0),
        delivery_count: Some(0),
        locked_until: Time::Null,
        holder: Holder::Null,
        session_id: Session::Text(none()),
        enqueued_at: Time::Now(0),
        scheduled_at: Time::Null,
        expires_at: Time::Null,
        ttl_ms: None,
        message_id: Text(Some("odd".into())),
        correlation_id: none(),
        causation_id: none(),
        message_type: none(),
        content_type: none(),
        reply_to: none(),
        properties: Json(None),
        dl_reason: none(),
        dl_description: none(),
        dl_source: none(),
        body: Body(None),
    }
}

/// An odd row for the endpoint: a plain row with the columns that steer the retry policy
/// (delivery count, time-to-live, properties such as `courier.retry.delayed`) odd half of
/// the time, each other column taken from a generated row with probability 0.15, and a
/// body its handler reads; and how many of its handler's first attempts fail.
pub(super) fn endpoint_row() -> impl Strategy<Value = (Row, u32)> {
    let steering = (
        prop::option::weighted(
            0.5,
            prop::sample::select(vec![0_i32, 1, 3, 9, 10, 11, -1, i32::MIN, i32::MAX]).prop_map(Some),
        ),
        prop::option::weighted(
            0.5,
            prop::sample::select(vec![
                1_i64,
                5_000,
                3_600_000,
                3_162_240_000_000,
                0,
                -1,
                3_162_240_000_001,
                i64::MAX,
            ])
            .prop_map(Some),
        ),
        prop::option::weighted(0.5, properties()),
    );
    (
        row(),
        steering,
        prop::collection::vec(prop::bool::weighted(0.15), 12),
        prop::sample::select(vec![1_u32, 2, 4]),
        prop::sample::select(vec![Some("application/json"), None]),
    )
        .prop_map(|(odd, (count, ttl, props), take, fails, content_type)| {
            let mut row = plain();
            if let Some(c) = count {
                row.delivery_count = c;
            }
            if let Some(t) = ttl {
                row.ttl_ms = t;
            }
            if let Some(p) = props {
                row.properties = p;
            }
            let mut i = 0;
            let mut next = || {
                i += 1;
                take[i - 1]
            };
            if next() {
                row.max_delivery_count = odd.max_delivery_count;
                row.default_ttl = odd.default_ttl;
            }
            if next() {
                row.seq = odd.seq;
            }
            if next() {
                row.state = odd.state;
                row.scheduled_at = odd.scheduled_at;
            }
            if next() {
                row.locked_until = odd.locked_until;
                row.holder = odd.holder;
            }
            if next() {
                row.session_id = odd.session_id;
            }
            if next() {
                row.enqueued_at = odd.enqueued_at;
            }
            if next() {
                row.expires_at = odd.expires_at;
            }
            if next() {
                row.message_id = odd.message_id;
            }
            if next() {
                row.correlation_id = odd.correlation_id;
                row.causation_id = odd.causation_id;
                row.reply_to = odd.reply_to;
            }
            if next() {
                row.dl_reason = odd.dl_reason;
                row.dl_description = odd.dl_description;
                row.dl_source = odd.dl_source;
            }
            if next() && odd.target == Target::Missing {
                row.target = Target::Missing;
            }
            row.message_type = Text(Some("rowprop.Job".into()));
            row.content_type = Text(content_type.map(str::to_owned));
            row.body = Body(Some(format!(r#"{{"n":1,"fail":{fails}}}"#).into_bytes()));
            (row, fails)
        })
}

impl Env {
    /// Rows of the case the endpoint may still take or is still settling: active and
    /// unlocked, active and locked by a live holder, or scheduled and due within a minute.
    async fn pending(&self, case: &Case) -> i64 {
        let now = self.clock.now();
        // Locked by a live holder (the endpoint's own transport: the case's entities are
        // its alone) counts: a handling that ended (`running` is 0) may not have settled
        // yet. Before, a failed attempt's abandon still in flight ended the wait, and the
        // row was found active and unlocked a moment later (seen once in CI, under load).
        sqlx::query_scalar(
            "SELECT count(*) FROM courier.message m WHERE m.entity_id = ANY($1) \
             AND ((m.state = 0 AND (m.locked_until IS NULL OR m.locked_until <= $2 \
                    OR (m.holder IS NOT NULL AND EXISTS (SELECT 1 FROM pg_locks l \
                        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                        AND l.classid::bigint = m.holder >> 32 \
                        AND l.objid::bigint = m.holder & 2147483647)))) \
               OR (m.state = 1 AND m.scheduled_at <= $3))",
        )
        .bind(&case.ids)
        .bind(now)
        .bind(now + chrono::Duration::seconds(60))
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub(super) async fn endpoint_case(&self, row: &Row) -> Result<(), Vec<Failure>> {
        let case = self.entities(row, "rowprop-ep").await;
        let result = self.endpoint_case_on(row, &case).await;
        self.drop_entities(&case).await;
        result
    }

    async fn endpoint_case_on(&self, row: &Row, case: &Case) -> Result<(), Vec<Failure>> {
        let refused = self.insert(row, case).await.map_err(|f| vec![f])?;
        self.send_valid(case, r#"{"n":0,"fail":0}"#, "rowprop.Job", false)
            .await
            .map_err(|f| vec![f])?;
        let probe = Probe::default();
        let endpoint = Endpoint::builder(case.send_to.clone())
            .transport(self.transport.clone())
            .store(self.transport.store())
            .state(probe.clone())
            .recoverability(policy())
            .handler(handle_job)
            .start()
            .await
            .unwrap();
        // Up to 40 s of virtual time, in steps of 500 ms taken only while no handling runs
        // (a slow machine does not make time pass under a handler): the delayed retry
        // (5 s) comes back, and anything left is due later than that. Then (or at most 15 s
        // of real time) the handlings are let finish.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let (mut steps, mut idle) = (0, 0);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(25)).await;
            let running = endpoint.stats().running;
            idle = if running == 0 { idle + 1 } else { 0 };
            let odd_ok = probe.of(1).iter().any(|a| a.ok);
            let valid_ok = probe.of(0).iter().any(|a| a.ok);
            if running == 0 && valid_ok && (odd_ok || self.pending(case).await == 0) {
                break;
            }
            if steps < 80 {
                if running == 0 {
                    self.clock.advance(Duration::from_millis(500));
                    steps += 1;
                }
            } else if idle >= 10 && valid_ok {
                break;
            }
        }
        let left = self.inspect(case).await;
        endpoint.shutdown().await.unwrap();

        let mut failures = Vec::new();
        let valid = probe.of(0);
        if valid.len() != 1 || !valid[0].ok {
            failures.push(fail(
                if valid.is_empty() {
                    class::VALID_MISSING
                } else {
                    class::VALID_TWICE
                },
                format!("{valid:?}"),
            ));
        }
        let odd = probe.of(1);
        check_attempts(&odd, &left, row.max_delivery_count, &mut failures);
        let receiver = self.transport.receiver(&case.path).await.unwrap();
        let ends = self.judge(row, case, &receiver, &left, &mut failures).await;
        if refused.is_none() && odd.is_empty() && ends.is_empty() {
            failures.push(fail(class::LOST, "no row is left, and the handler never saw it"));
        }
        if let Some(code) = refused {
            self.count(format!("refused at INSERT ({code})"));
        } else if odd.iter().any(|a| a.ok) {
            self.count(format!("handled after {} failed attempts", odd.len() - 1));
        }
        for end in ends {
            self.count(end);
        }
        if failures.is_empty() {
            Ok(())
        } else {
            for f in &mut failures {
                f.detail = format!("{}\n      attempts: {odd:?}", f.detail);
            }
            Err(failures)
        }
    }
}
