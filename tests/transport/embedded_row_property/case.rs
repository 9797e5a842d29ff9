//! One case: the entities made, the row written with no broker open, the broker opened
//! again, the valid message sent and the receives; then the oracle (`pg_row_property`'s
//! classes) on what they saw and on the rows left in the file.

use courier::{Clock, Embedded, Envelope, SenderOptions, Transport};
use sqlx::{Connection, Row as _};

use super::env::{Case, Env};
use super::row::Row;
use super::{
    Failure, HORIZON_DAYS, LOCK_GRACE_MS, Outcome, PAST_ONE_PERIOD, Seen, Shape, Target, class, fail, round,
    take_deferred,
};

/// The class of a broker that does not open on the file.
const OPEN_FAILED: &str = "the broker does not open the file";

/// A row of the case as the oracle reads it after the receives.
struct Found {
    entity_id: i64,
    /// `None` when the state is not an integer.
    state: Option<i64>,
    delivery_count: Option<i64>,
    seq: Option<i64>,
    session_id: Option<String>,
    is_valid: bool,
    dl_ok: bool,
    schedule_ok: bool,
    locked: bool,
    lock_in_bounds: bool,
    shown: String,
}

/// Every row of the case's entities (and the odd row, wherever it is), with what the
/// oracle asks of it computed in SQL: `?1` the entities as a JSON array, `?2` now, `?3`
/// the horizon, `?4` the lock duration + 5 min, `?5` the valid message's id, `?6` the odd
/// row's id.
const INSPECT: &str = "SELECT entity_id, \
       CASE WHEN typeof(state) = 'integer' THEN state END AS state, \
       CASE WHEN typeof(delivery_count) = 'integer' THEN delivery_count END AS delivery_count, \
       CASE WHEN typeof(seq) = 'integer' THEN seq END AS seq, \
       CAST(CASE WHEN typeof(session_id) = 'text' THEN session_id END AS BLOB) AS session_id, \
       coalesce(typeof(message_id) = 'text' AND message_id = ?5, 0) AS is_valid, \
       coalesce(dl_reason, '') <> '' AND coalesce(dl_description, '') <> '' AS dl_ok, \
       coalesce(typeof(scheduled_at) = 'integer' AND scheduled_at > ?2 AND scheduled_at <= ?3, 0) AS schedule_ok, \
       coalesce(locked_until > ?2, 0) AS locked, \
       coalesce(typeof(locked_until) = 'integer' AND locked_until <= ?2 + ?4, 0) AS lock_in_bounds, \
       CAST(printf('row %d of entity %s: state %s (%s), delivery_count %s (%s), seq %s, locked_until %s, \
scheduled_at %s (%s), expires_at %s, ttl_ms %s, enqueued_at %s, message_id %s (%s), session_id %s, dl_reason %s, \
dl_description %s', id, entity_id, quote(state), typeof(state), quote(delivery_count), typeof(delivery_count), \
         quote(seq), quote(locked_until), quote(scheduled_at), typeof(scheduled_at), quote(expires_at), \
         quote(ttl_ms), quote(enqueued_at), quote(substr(message_id, 1, 24)), typeof(message_id), \
         quote(substr(session_id, 1, 24)), quote(dl_reason), quote(substr(dl_description, 1, 160))) AS BLOB) AS shown \
     FROM courier_message WHERE entity_id IN (SELECT value FROM json_each(?1)) OR id = ?6 ORDER BY id";

impl Env {
    async fn inspect(&self, case: &Case, odd_id: i64) -> Vec<Found> {
        let now = self.clock.now();
        let mut conn = self.sql().await;
        let rows = sqlx::query(INSPECT)
            .bind(serde_json::to_string(&case.ids).unwrap())
            .bind(now.timestamp_micros())
            .bind((now + chrono::Duration::days(HORIZON_DAYS)).timestamp_micros())
            .bind((case.lock_ms + LOCK_GRACE_MS) * 1000)
            .bind(&case.valid_id)
            .bind(odd_id)
            .fetch_all(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        rows.iter()
            .map(|r| Found {
                entity_id: r.get("entity_id"),
                state: r.get("state"),
                delivery_count: r.get("delivery_count"),
                seq: r.get("seq"),
                session_id: r
                    .get::<Option<Vec<u8>>, _>("session_id")
                    .map(|b| String::from_utf8_lossy(&b).into_owned()),
                is_valid: r.get("is_valid"),
                dl_ok: r.get("dl_ok"),
                schedule_ok: r.get("schedule_ok"),
                locked: r.get("locked"),
                lock_in_bounds: r.get("lock_in_bounds"),
                shown: String::from_utf8_lossy(&r.get::<Vec<u8>, _>("shown")).into_owned(),
            })
            .collect()
    }

    pub(super) async fn case(&self, row: &Row) -> Result<Outcome, Vec<Failure>> {
        let broker = self
            .open()
            .await
            .map_err(|e| vec![fail(OPEN_FAILED, format!("before the row was written: {e}"))])?;
        let case = self.entities(&broker, row).await;
        broker.close().await;
        let mut conn = self.sql().await;
        let written = self.write(&mut conn, row, &case).await;
        conn.close().await.unwrap();
        let (odd_id, refused) = match written {
            Ok(w) => w,
            Err(f) => {
                self.clean(&case, None).await;
                return Err(vec![f]);
            }
        };
        let result = match self.open().await {
            Ok(broker) => {
                let result = self.case_on(&broker, row, &case, odd_id, refused).await;
                broker.close().await;
                result
            }
            Err(e) => Err(vec![fail(OPEN_FAILED, e.to_string())]),
        };
        self.clean(&case, Some(odd_id)).await;
        result
    }

    async fn case_on(
        &self,
        broker: &Embedded,
        row: &Row,
        case: &Case,
        odd_id: i64,
        refused: Option<String>,
    ) -> Result<Outcome, Vec<Failure>> {
        let mut valid = Envelope::new("{}")
            .with_message_id(case.valid_id.clone())
            .with_message_type("rowprop.Valid")
            .with_content_type("application/json");
        if row.shape == Shape::Sessions {
            valid = valid.with_session_id(case.valid_session.clone());
        }
        let sender = broker.sender(&case.send_to, SenderOptions::default()).await.unwrap();
        let mut failures = Vec::new();
        if let Err(e) = sender.send(valid).await {
            failures.push(fail(class::SEND_FAILED, e.to_string()));
        }
        let receiver = broker.receiver(&case.path).await.unwrap();
        let mut seen = Seen::default();
        round(broker, row.shape, &case.path, &receiver, &case.valid_id, &mut seen).await;
        self.clock.advance(PAST_ONE_PERIOD);
        round(broker, row.shape, &case.path, &receiver, &case.valid_id, &mut seen).await;
        failures.append(&mut seen.failures);
        match seen.valid {
            1 => {}
            0 => failures.push(fail(class::VALID_MISSING, case.valid_id.clone())),
            n => failures.push(fail(class::VALID_TWICE, format!("{n} times"))),
        }
        let left = self.inspect(case, odd_id).await;
        let mut ends = Vec::new();
        let judged = refused.is_none() && row.target != Target::Missing;
        for f in left.iter().filter(|f| !f.is_valid) {
            if !case.ids.contains(&f.entity_id) {
                // Not on any entity of the case: no queue holds it (a row of an entity
                // that does not exist, kept as written).
                ends.push("on no entity");
                continue;
            }
            let locked_end = || {
                if f.lock_in_bounds {
                    None
                } else {
                    Some(fail(class::LOCK_TOO_LONG, f.shown.clone()))
                }
            };
            let (end, failure) = match f.state {
                Some(3) => (
                    "dead-lettered",
                    (!f.dl_ok).then(|| fail(class::DEAD_NO_REASON, f.shown.clone())),
                ),
                Some(1) => (
                    "scheduled",
                    (!f.schedule_ok).then(|| fail(class::BAD_SCHEDULE, f.shown.clone())),
                ),
                _ if f.locked => ("locked by the broker", locked_end()),
                Some(2) if f.delivery_count.unwrap_or(0) < 1 => {
                    ("deferred", Some(fail(class::DEFERRED_ZERO, f.shown.clone())))
                }
                Some(2) => {
                    let got = match (f.entity_id == case.receiving, f.seq) {
                        (true, Some(seq)) => {
                            take_deferred(broker, row.shape, &case.path, &receiver, f.session_id.as_deref(), seq).await
                        }
                        _ => Err("it is not on an entity a receiver reads".to_owned()),
                    };
                    (
                        "deferred, received by sequence number",
                        got.err()
                            .map(|e| fail(class::DEFERRED_UNREACHABLE, format!("{}: {e}", f.shown))),
                    )
                }
                _ => ("active", Some(fail(class::STUCK_ACTIVE, f.shown.clone()))),
            };
            ends.push(end);
            failures.extend(failure);
        }
        if judged && seen.odd.is_empty() && ends.is_empty() {
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
