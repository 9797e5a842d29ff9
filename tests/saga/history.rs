//! A workflow's history (issue 33), on every store: each handled message's event commits
//! with its effects (one event per inbox record), says what the handling sent and did to
//! the saga instance (the state before and after, the timeouts requested and fired, the
//! completion); a failed attempt is an event of its own and leaves no handled event; a
//! duplicate is recorded as one; the janitor deletes events past the retention; and an
//! endpoint without history writes none.

use std::time::Duration;

use courier::saga::SagaOptions;
use courier::{HistoryDetail, HistoryKind, HistoryOptions, RetryPolicy, SendOptions};
use courier_tests::eventually;
use courier_tests::stores::StoreKind;
use serde::Deserialize;

use super::{Bump, Env, Finish, begin, handled};

const DAY: u64 = 86_400;

/// An event as read back from the store's table.
#[derive(Debug, Deserialize)]
struct Row {
    kind: HistoryKind,
    #[serde(rename = "type")]
    message_type: Option<String>,
    id: String,
    attempt: u32,
    detail: HistoryDetail,
}

/// The endpoint's history, oldest first.
async fn events(env: &Env) -> Vec<Row> {
    let sql = if env.env.kind.postgres() {
        "SELECT json_build_object('kind', kind, 'type', message_type, 'id', message_id, 'attempt', attempt, \
         'detail', detail)::text FROM courier.history ORDER BY id"
    } else {
        "SELECT json_object('kind', kind, 'type', message_type, 'id', message_id, 'attempt', attempt, \
         'detail', json(detail)) FROM courier_history_all ORDER BY id"
    };
    env.env
        .texts(sql)
        .await
        .into_iter()
        .map(|t| serde_json::from_str(&t.unwrap()).unwrap())
        .collect()
}

/// How many events of a handling attempt (not a dispatcher's) lack the time the attempt
/// began.
async fn without_received_at(env: &Env) -> i64 {
    env.env
        .count(&format!(
            "SELECT COUNT(*) FROM {} WHERE received_at IS NULL AND kind NOT LIKE 'timeout_%'",
            env.env.kind.table("history")
        ))
        .await
}

/// How many events of the instance the index holds.
async fn instance_rows(env: &Env, correlation: &str) -> i64 {
    env.env
        .count(&format!(
            "SELECT COUNT(*) FROM {} WHERE saga_type = 'tests.Flow' AND correlation = '{correlation}'",
            env.env.kind.table("history_instance")
        ))
        .await
}

fn state(json: Option<&str>) -> serde_json::Value {
    serde_json::from_str(json.expect("a state")).unwrap()
}

/// Begin (a reminder in an hour), a bump, the reminder fires, finish: four handled
/// events, one per inbox record, each with what it did to the instance.
async fn the_history_of_a_saga_commits_with_its_effects(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env
        .builder(SagaOptions::default())
        .history(HistoryOptions::new().keep_for(Duration::from_secs(2 * DAY)))
        .start()
        .await
        .unwrap();
    handled(&flows, &begin("h-1", Some(3600)), 1).await;
    handled(&flows, &Bump { id: "h-1".into() }, 2).await;
    env.advance(3601);
    eventually("the reminder", || async { env.fired() == 1 }).await;
    eventually("its handling", || async { flows.stats().completed == 3 }).await;
    handled(&flows, &Finish { id: "h-1".into() }, 4).await;
    // The dispatcher's event of the reminder: on a store that enqueues in its claim it is
    // written there, before the handling; on the others right after the send, a step of
    // its own, so it may come after the handling's (both at the same virtual time), and
    // even after the handling of `Finish` on a loaded machine (a CI run read the history
    // before it was written).
    eventually("the reminder's dispatched event", || async {
        events(&env)
            .await
            .iter()
            .any(|e| e.kind == HistoryKind::TimeoutDispatched)
    })
    .await;

    let all = events(&env).await;
    let (dispatched, events): (Vec<Row>, Vec<Row>) =
        all.into_iter().partition(|e| e.kind == HistoryKind::TimeoutDispatched);
    assert_eq!(dispatched.len(), 1, "one timeout dispatched: {dispatched:?}");
    let kinds: Vec<(HistoryKind, Option<&str>)> = events.iter().map(|e| (e.kind, e.message_type.as_deref())).collect();
    assert_eq!(
        kinds,
        vec![
            (HistoryKind::Handled, Some("saga.Begin")),
            (HistoryKind::Handled, Some("saga.Bump")),
            (HistoryKind::Handled, Some("saga.Remind")),
            (HistoryKind::Handled, Some("saga.Finish")),
        ]
    );
    assert_eq!(
        i64::try_from(events.len()).unwrap(),
        env.rows("inbox").await,
        "one handled event per inbox record: the event commits with the effects"
    );
    assert_eq!(instance_rows(&env, "h-1").await, 5, "four handlings and the dispatch");
    assert!(events.iter().all(|e| e.attempt == 1));

    let begun = &events[0].detail.sagas[0];
    assert_eq!(
        (begun.saga_type.as_str(), begun.correlation.as_str()),
        ("tests.Flow", "h-1")
    );
    assert_eq!(begun.before, None, "a new instance has no state before");
    assert_eq!(state(begun.after.as_deref())["starts"], 1);
    assert_eq!(begun.timeouts_requested.len(), 1, "the reminder requested");
    let reminder = begun.timeouts_requested[0].id.clone();

    let bumped = &events[1].detail.sagas[0];
    assert_eq!(state(bumped.before.as_deref())["count"], 0);
    assert_eq!(state(bumped.after.as_deref())["count"], 1);

    let sent = &dispatched[0];
    assert_eq!(sent.id, reminder, "the event names the timeout's message");
    assert_eq!((sent.message_type.as_deref(), sent.attempt), (Some("saga.Remind"), 1));
    let timeout = sent.detail.timeout.as_ref().expect("the timeout it is about");
    assert_eq!(
        (
            timeout.saga_type.as_str(),
            timeout.correlation.as_str(),
            timeout.mark.id.as_str()
        ),
        ("tests.Flow", "h-1", reminder.as_str())
    );
    assert_eq!(timeout.mark.due, begun.timeouts_requested[0].due);

    let fired = &events[2].detail.sagas[0];
    assert_eq!(
        fired.timeout_fired.as_deref(),
        Some(reminder.as_str()),
        "the reminder fired"
    );

    let finished = &events[3].detail.sagas[0];
    assert!(finished.completed);
    assert!(!events[0].detail.sagas[0].completed);

    // Past the retention, the janitor deletes the events and their index rows.
    env.advance(3 * DAY);
    eventually("the history purged", || async {
        env.rows("history").await == 0 && instance_rows(&env, "h-1").await == 0
    })
    .await;
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// The reminder's handler fails twice (one immediate retry, then the dead-letter queue):
/// two events of their own, with the error and the reason; no handled event for it.
async fn a_failed_attempt_is_an_event_of_its_own(kind: StoreKind) {
    let env = Env::new(kind).await;
    env.probe.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let flows = env
        .builder(SagaOptions::default())
        .history(HistoryOptions::new())
        .recoverability(RetryPolicy::default().immediate(1).delayed([]))
        .start()
        .await
        .unwrap();
    handled(&flows, &begin("h-2", Some(60)), 1).await;
    env.advance(61);
    eventually("the reminder dead-lettered", || async {
        flows.stats().dead_lettered == 1
    })
    .await;
    let (dispatched, events): (Vec<Row>, Vec<Row>) = events(&env)
        .await
        .into_iter()
        .partition(|e| e.kind == HistoryKind::TimeoutDispatched);
    assert_eq!(dispatched.len(), 1, "the reminder sent once: {dispatched:?}");
    let kinds: Vec<HistoryKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![HistoryKind::Handled, HistoryKind::Retried, HistoryKind::DeadLettered]
    );
    assert_eq!(dispatched[0].id, events[1].id, "the message the attempts failed");
    let (retried, dead) = (&events[1], &events[2]);
    assert_eq!(retried.message_type.as_deref(), Some("saga.Remind"));
    assert_eq!(retried.id, dead.id, "the same message");
    assert!(
        retried
            .detail
            .error
            .as_deref()
            .is_some_and(|e| e.contains("the reminder cannot be handled")),
        "{:?}",
        retried.detail
    );
    assert!(dead.detail.reason.is_some(), "{:?}", dead.detail);
    assert!(
        retried.detail.sagas.is_empty() && dead.detail.sagas.is_empty(),
        "rolled back: no change"
    );
    assert_eq!((retried.attempt, dead.attempt), (1, 2));
    assert_eq!(
        without_received_at(&env).await,
        0,
        "a failed attempt says when it began"
    );
    assert_eq!(
        instance_rows(&env, "h-2").await,
        2,
        "the handled start and the dispatch: the failed attempts name no instance"
    );
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Regression: a failed attempt's number counts delayed retries as a handled one's
/// (`Context::attempt`) does. The reminder fails, is retried after a delay (a new
/// delivery, whose broker count starts again at 1), and fails again: attempts 1 and 2
/// (before, the events said 1 and 1, the delivery count).
async fn a_failed_attempt_after_a_delayed_retry_is_numbered_as_the_handler_sees_it(kind: StoreKind) {
    let env = Env::new(kind).await;
    env.probe.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let flows = env
        .builder(SagaOptions::default())
        .history(HistoryOptions::new())
        .recoverability(RetryPolicy::none().delayed([Duration::from_secs(10)]))
        .start()
        .await
        .unwrap();
    handled(&flows, &begin("h-4", Some(60)), 1).await;
    env.advance(61);
    eventually("the first attempt", || async { flows.stats().retried == 1 }).await;
    env.advance(11);
    eventually("the delayed retry dead-lettered", || async {
        flows.stats().dead_lettered == 1
    })
    .await;
    let failed: Vec<(HistoryKind, u32)> = events(&env)
        .await
        .iter()
        .filter(|e| matches!(e.kind, HistoryKind::Retried | HistoryKind::DeadLettered))
        .map(|e| (e.kind, e.attempt))
        .collect();
    assert_eq!(failed, vec![(HistoryKind::Retried, 1), (HistoryKind::DeadLettered, 2)]);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// The same message id twice: handled, then a duplicate the inbox dropped.
async fn a_duplicate_is_recorded(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env
        .builder(SagaOptions::default())
        .history(HistoryOptions::new())
        .start()
        .await
        .unwrap();
    handled(&flows, &begin("h-3", None), 1).await;
    for n in 2..=3 {
        flows
            .bus()
            .send_with(&Bump { id: "h-3".into() }, SendOptions::new().message_id("bump-once"))
            .await
            .unwrap();
        eventually("the bump", || async { flows.stats().completed >= n }).await;
    }
    let events = events(&env).await;
    let kinds: Vec<(HistoryKind, &str)> = events.iter().map(|e| (e.kind, e.id.as_str())).collect();
    assert_eq!(
        kinds[1..],
        [
            (HistoryKind::Handled, "bump-once"),
            (HistoryKind::Duplicate, "bump-once")
        ]
    );
    assert_eq!(env.field("h-3", "count").await, 1);
    assert_eq!(
        without_received_at(&env).await,
        0,
        "a duplicate says when it was taken up"
    );
    assert!(events.iter().all(|e| e.attempt == 1), "each copy a first attempt");
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Handlings that share a commit group on Postgres write their events at the group's
/// commit, in one statement: each commits with its effects (one handled event per inbox
/// record), and each instance row names the event of its own instance (the ids the
/// statement took from the sequence); members rolled back by a conflict leave none.
async fn grouped_handlings_write_their_events_at_the_group_commit(kind: StoreKind) {
    use courier::{Message as _, SenderOptions};
    let env = Env::new(kind).await;
    let flows = env
        .builder(SagaOptions::default())
        .concurrency(8)
        .group_commit(4)
        .recoverability(RetryPolicy::default().immediate(100).delayed([]))
        .history(HistoryOptions::new())
        .start()
        .await
        .unwrap();
    for id in ["hg-1", "hg-2", "hg-3", "hg-4"] {
        flows.bus().send(&begin(id, None)).await.unwrap();
    }
    eventually("four instances", || async { flows.stats().completed == 4 }).await;
    let round = ["hg-1", "hg-2", "hg-2", "hg-1", "hg-3", "hg-4", "hg-4", "hg-3"];
    let envelopes = (0..10)
        .flat_map(|_| round.map(|id| Bump { id: id.into() }.to_envelope().unwrap()))
        .collect();
    let sender = env
        .env
        .fx
        .transport
        .sender("flows", SenderOptions::default())
        .await
        .unwrap();
    sender.send_batch(envelopes).await.unwrap();
    eventually("80 bumps", || async { flows.stats().completed == 84 }).await;
    flows.shutdown().await.unwrap();

    let handled: Vec<Row> = events(&env)
        .await
        .into_iter()
        .filter(|e| e.kind == HistoryKind::Handled)
        .collect();
    assert_eq!(handled.len(), 84, "one handled event per handling");
    assert_eq!(
        i64::try_from(handled.len()).unwrap(),
        env.rows("inbox").await,
        "one handled event per inbox record"
    );
    for id in ["hg-1", "hg-2", "hg-3", "hg-4"] {
        let own = handled
            .iter()
            .filter(|e| e.detail.sagas.iter().any(|s| s.correlation == id))
            .count();
        assert_eq!(own, 21, "{id}: its start and twenty bumps");
        assert_eq!(instance_rows(&env, id).await, 21, "{id}: an instance row per event");
    }
    let misplaced = env
        .env
        .count(
            "SELECT COUNT(*) FROM courier.history_instance_all i JOIN courier.history h ON h.id = i.history_id \
             WHERE h.detail -> 'sagas' -> 0 ->> 'correlation' <> i.correlation",
        )
        .await;
    assert_eq!(misplaced, 0, "each instance row names its own event");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_handlings_write_their_events_at_the_group_commit_on_postgres() {
    grouped_handlings_write_their_events_at_the_group_commit(StoreKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_handlings_write_their_events_at_the_group_commit_on_the_postgres_transport() {
    grouped_handlings_write_their_events_at_the_group_commit(StoreKind::PgTransport).await;
}

#[courier::handler]
async fn count_bump(_bump: Bump, _ctx: &mut courier::Context) -> Result<(), courier::HandlerError> {
    Ok(())
}

/// Without `EndpointBuilder::history`, nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_without_history_writes_none() {
    let env = Env::new(StoreKind::Sqlite).await;
    let flows = env.start().await;
    handled(&flows, &begin("h-4", None), 1).await;
    assert_eq!(env.rows("history").await, 0);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// A history needs a store that keeps one, and sane limits: refused at start, saying
/// what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_the_endpoint_cannot_keep_is_refused_at_start() {
    let env = Env::new(StoreKind::Sqlite).await;
    let e = env
        .builder(SagaOptions::default())
        .history(HistoryOptions::new().keep_for(Duration::from_secs(1)))
        .start()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("at least a minute"), "{e}");
    let e = courier::Endpoint::builder("no-store")
        .transport(env.env.fx.transport.clone())
        .handler(count_bump)
        .history(HistoryOptions::new())
        .start()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("call EndpointBuilder::store"), "{e}");
    env.finish().await;
}

on_every_store!(
    the_history_of_a_saga_commits_with_its_effects,
    a_failed_attempt_is_an_event_of_its_own,
    a_failed_attempt_after_a_delayed_retry_is_numbered_as_the_handler_sees_it,
    a_duplicate_is_recorded,
);
