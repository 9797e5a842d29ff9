//! A handling's events ride with the messages it sends on `PostgresStore` (issue 33,
//! docs/history.md "Cost"): one event in a statement of its own shape (its columns as
//! values, its first saga instance among them, an insert of the others only if it has
//! any), several (a commit group's, or a handling's events) in the form with arrays; a
//! handling that sends nothing writes them in the same shapes before its `COMMIT`.
//! Over any one to three events (any field, any number of saga instances) recorded in a
//! unit of work that then sends none, one or two messages and commits: every event is
//! stored once, in order, each with exactly its saga instances (the first in its row,
//! the others in `courier.history_instance`, read as one through
//! `courier.history_instance_all`), and the messages are in the outbox; a plain delete of
//! the events takes their instance rows with them.

use courier::{Envelope, HistoryEvent, PostgresStore, Store};
use courier_tests::pg::TestDatabase;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::history_rows::event;

fn failed(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Writes `events` and `sends` messages in one unit of work for message `id`, committed.
async fn handle(store: &PostgresStore, id: &str, events: &[HistoryEvent], sends: usize) -> Result<(), TestCaseError> {
    let now = chrono::Utc::now();
    let courier::Begin::Fresh(mut work) = store.begin("orders", id, None, now).await.map_err(failed)? else {
        return Err(failed("a fresh id was taken for a duplicate"));
    };
    for event in events {
        work.record_history(event).await.map_err(failed)?;
    }
    let messages = (0..sends)
        .map(|k| {
            let envelope = Envelope::new("{}").with_message_id(format!("{id}-out-{k}"));
            ("shipping".to_owned(), false, envelope)
        })
        .collect();
    work.store_outgoing(messages, now).await.map_err(failed)?;
    work.commit().await.map_err(failed)?;
    Ok(())
}

#[test]
fn any_handled_events_ride_with_the_sent_messages_with_their_instances() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (db, pool) = rt.block_on(async {
        let db = TestDatabase::create().await;
        let pool = db.pool().await;
        PostgresStore::from_pool(pool.clone()).migrate().await.unwrap();
        (db, pool)
    });
    let store = PostgresStore::from_pool(pool.clone());
    let cases = (proptest::collection::vec(event(), 1..=3), 0_usize..=2);
    courier_tests::run_property(&rt, courier_tests::fuzz_cases(48), &cases, |n, (events, sends)| {
        let (store, pool) = (store.clone(), pool.clone());
        async move {
            let before: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM courier.history")
                .fetch_one(&pool)
                .await
                .map_err(failed)?;
            let id = format!("m{n}");
            handle(&store, &id, &events, sends).await?;
            let stored: Vec<(i64, i32)> =
                sqlx::query_as("SELECT h.id, h.attempt FROM courier.history h WHERE h.id > $1 ORDER BY h.id")
                    .bind(before)
                    .fetch_all(&pool)
                    .await
                    .map_err(failed)?;
            prop_assert_eq!(stored.len(), events.len(), "every event once");
            for ((history_id, attempt), event) in stored.iter().zip(&events) {
                prop_assert_eq!(*attempt, i32::try_from(event.attempt).unwrap_or(i32::MAX), "in order");
                let instances: Vec<(String, String)> = sqlx::query_as(
                    "SELECT saga_type, correlation FROM courier.history_instance_all WHERE history_id = $1 \
                     ORDER BY saga_type COLLATE \"C\", correlation COLLATE \"C\"",
                )
                .bind(history_id)
                .fetch_all(&pool)
                .await
                .map_err(failed)?;
                let scrub = |s: &str| s.replace('\0', "\u{FFFD}");
                let mut expected: Vec<(String, String)> =
                    event.instances().iter().map(|(t, c)| (scrub(t), scrub(c))).collect();
                expected.sort();
                expected.dedup();
                prop_assert_eq!(instances, expected, "each event with exactly its saga instances");
            }
            let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.outbox WHERE source_id = $1")
                .bind(&id)
                .fetch_one(&pool)
                .await
                .map_err(failed)?;
            prop_assert_eq!(
                usize::try_from(sent).map_err(failed)?,
                sends,
                "the messages in the outbox"
            );
            // An operator's own delete of the events (a deletion request) takes their
            // instance rows too (the trigger that replaced the foreign key's cascade).
            sqlx::query("DELETE FROM courier.history WHERE id > $1")
                .bind(before)
                .execute(&pool)
                .await
                .map_err(failed)?;
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM courier.history_instance_all WHERE history_id > $1")
                    .bind(before)
                    .fetch_one(&pool)
                    .await
                    .map_err(failed)?;
            prop_assert_eq!(left, 0, "no instance row outlives its event");
            Ok(())
        }
    });
    rt.block_on(async {
        pool.close().await;
        db.drop_now().await;
    });
}
