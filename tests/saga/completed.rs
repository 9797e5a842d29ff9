//! A duplicate start after the saga completed (issue 34, part 4): a client's retry of the
//! start message after its workflow ended started a new instance (a second assessor, a new
//! 14-day timeout). With `SagaOptions::remember_completed`, a marker of each completed
//! instance is kept for a retention, and a late start is ignored, dead-lettered, or
//! started anew knowing it is one, as the saga chooses. On the three stores with the
//! embedded broker and on the Postgres transport.

use std::time::Duration;

use courier::saga::{LateStart, SagaOptions, reasons};
use courier::{EntityPath, RunningEndpoint};
use courier_tests::eventually;
use courier_tests::stores::StoreKind;

use super::{Bump, Env, Finish, begin, handled};

const DAY: u64 = 86_400;

async fn start(env: &Env, options: SagaOptions) -> RunningEndpoint {
    env.builder(options).start().await.unwrap()
}

/// Begins instance `id` with a reminder in an hour and completes it: `n` messages
/// handled in all.
async fn begin_and_finish(flows: &RunningEndpoint, id: &str, n: u64) {
    handled(flows, &begin(id, Some(3600)), n + 1).await;
    handled(flows, &Finish { id: id.into() }, n + 2).await;
}

/// The start message arrives again after completion: recognised by the marker, completed
/// without running the start handler; no instance, no timeout. After the retention the
/// same start begins a new instance, and a later completion deletes the expired marker.
async fn a_start_after_completion_is_ignored_until_the_marker_expires(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = start(
        &env,
        SagaOptions::new().remember_completed(Duration::from_secs(DAY), LateStart::Ignore),
    )
    .await;
    begin_and_finish(&flows, "c-1", 0).await;
    assert_eq!(env.rows("saga_completed").await, 1, "the marker, with the completion");
    handled(&flows, &begin("c-1", Some(3600)), 3).await;
    assert_eq!(flows.stats().saga_late_starts, 1);
    assert_eq!(env.rows("saga").await, 0, "no new instance");
    assert_eq!(env.rows("saga_timeout").await, 0, "no new timeout");
    assert_eq!(flows.stats().dead_lettered, 0);
    env.advance(DAY + 1);
    handled(&flows, &begin("c-1", None), 4).await;
    assert_eq!(env.rows("saga").await, 1, "after the retention: a new instance");
    assert_eq!(flows.stats().saga_late_starts, 1);
    assert_eq!(env.field("c-1", "restarts").await, 0, "the marker had expired");
    begin_and_finish(&flows, "c-2", 4).await;
    assert_eq!(
        env.rows("saga_completed").await,
        1,
        "c-2's marker; c-1's expired one was deleted"
    );
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// `LateStart::DeadLetter`: the late start is dead-lettered with `courier.SagaCompleted`
/// and changes nothing.
async fn a_late_start_can_be_dead_lettered(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = start(
        &env,
        SagaOptions::new().remember_completed(Duration::from_secs(DAY), LateStart::DeadLetter),
    )
    .await;
    begin_and_finish(&flows, "c-3", 0).await;
    flows.bus().send(&begin("c-3", Some(3600))).await.unwrap();
    eventually("the dead letter", || async { flows.stats().dead_lettered == 1 }).await;
    let dead = env
        .env
        .fx
        .transport
        .peek(&EntityPath::queue("flows").dead_letter(), 0, 10)
        .await
        .unwrap();
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(reasons::SAGA_COMPLETED)
    );
    let description = dead[0].broker.dead_letter_description.clone().unwrap_or_default();
    assert!(
        description.contains("c-3") && description.contains("completed at"),
        "{description}"
    );
    assert_eq!((env.rows("saga").await, env.rows("saga_timeout").await), (0, 0));
    assert_eq!(flows.stats().saga_late_starts, 1);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// `LateStart::StartNew`: a new instance, whose start handler knows it follows a
/// completed one (`SagaContext::completed_before`).
async fn a_late_start_can_start_anew_knowing_it(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = start(
        &env,
        SagaOptions::new().remember_completed(Duration::from_secs(DAY), LateStart::StartNew),
    )
    .await;
    handled(&flows, &begin("c-4", None), 1).await;
    assert_eq!(env.field("c-4", "restarts").await, 0, "a first start");
    handled(&flows, &Finish { id: "c-4".into() }, 2).await;
    handled(&flows, &begin("c-4", None), 3).await;
    assert_eq!(env.field("c-4", "restarts").await, 1, "the handler saw the completion");
    assert_eq!(flows.stats().saga_late_starts, 1);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// A message tried again later (`retry_not_found`) whose instance completed is too late,
/// not too early: the marker says so, and it is not tried again.
async fn a_message_for_a_completed_instance_is_not_tried_again(kind: StoreKind) {
    let env = Env::new(kind).await;
    let options = SagaOptions::new()
        .retry_not_found::<Bump>(Duration::from_secs(30), 3)
        .remember_completed(Duration::from_secs(DAY), LateStart::Ignore);
    let flows = start(&env, options).await;
    begin_and_finish(&flows, "c-5", 0).await;
    handled(&flows, &Bump { id: "c-5".into() }, 3).await;
    assert_eq!(flows.stats().sagas_not_found, 1);
    assert_eq!(flows.stats().sagas_not_found_retried, 0, "too late: not sent back");
    // One that never had an instance is tried again, as before.
    handled(&flows, &Bump { id: "c-6".into() }, 4).await;
    assert_eq!(flows.stats().sagas_not_found_retried, 1);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

on_every_store!(
    a_start_after_completion_is_ignored_until_the_marker_expires,
    a_late_start_can_be_dead_lettered,
    a_late_start_can_start_anew_knowing_it,
    a_message_for_a_completed_instance_is_not_tried_again,
);
