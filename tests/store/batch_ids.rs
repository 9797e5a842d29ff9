//! `Store::begin_batch` over the whole space of a batch's message ids, on every store: for
//! any list of ids (repeated ones included, and ids an earlier handling recorded), a
//! member is fresh exactly when its id was not recorded before and does not occur earlier
//! in the list, and the transaction records each fresh id once. The batch statement
//! records the ids with one multi-row insert and reads back which it inserted: an id
//! given twice is inserted once, so its second member must not be counted fresh too
//! (handled twice). The endpoint's batcher never puts one id twice in a batch; a caller of
//! the public trait may.

use std::collections::BTreeSet;

use courier_tests::stores::{StoreEnv, StoreKind};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Ids a producer may send: ASCII, accents, spaces, an empty one, a long one.
fn pool() -> Vec<String> {
    vec![
        "a".into(),
        "b".into(),
        "é-ü".into(),
        " ".into(),
        String::new(),
        "x".repeat(300),
        "0190c4de-7c1f-7aa3-9e1e-1a2b3c4d5e6f".into(),
    ]
}

/// One case: `earlier` recorded and committed first, then a batch of `batch`, whose
/// answer is checked, committed, and the inbox read back.
async fn case(env: &StoreEnv, endpoint: &str, earlier: &[String], batch: &[String]) -> Result<(), TestCaseError> {
    let now = chrono::Utc::now();
    let failed = |e: courier::Error| TestCaseError::fail(e.to_string());
    if !earlier.is_empty() {
        let members = earlier.iter().map(|id| (id.clone(), None)).collect();
        let begun = env.store.begin_batch(endpoint, members, now).await.map_err(failed)?;
        if let Some(work) = begun.work {
            work.commit().await.map_err(failed)?;
        }
    }
    let members = batch.iter().map(|id| (id.clone(), None)).collect();
    let begun = env.store.begin_batch(endpoint, members, now).await.map_err(failed)?;
    prop_assert_eq!(begun.duplicates.len(), batch.len());
    let mut seen: BTreeSet<&String> = earlier.iter().collect();
    let mut fresh = 0;
    for (i, (id, answer)) in batch.iter().zip(&begun.duplicates).enumerate() {
        let expected_fresh = seen.insert(id);
        prop_assert_eq!(
            answer.is_none(),
            expected_fresh,
            "member {} ({:?}) of {:?}, recorded before: {:?}",
            i,
            id,
            batch,
            earlier
        );
        if let Some(left) = answer {
            prop_assert!(left.is_empty(), "nothing was sent by the earlier handlings");
        }
        fresh += usize::from(expected_fresh);
    }
    prop_assert_eq!(begun.work.is_some(), fresh > 0, "a transaction when a member is fresh");
    if let Some(work) = begun.work {
        work.commit().await.map_err(failed)?;
    }
    let table = if matches!(env.kind, StoreKind::Sqlite | StoreKind::Embedded) {
        "courier_inbox"
    } else {
        "courier.inbox"
    };
    let recorded = env
        .count(&format!(
            "SELECT COUNT(*) FROM {table} WHERE endpoint = '{}'",
            endpoint.replace('\'', "''")
        ))
        .await;
    let distinct: BTreeSet<&String> = earlier.iter().chain(batch).collect();
    prop_assert_eq!(recorded, i64::try_from(distinct.len()).unwrap_or(i64::MAX));
    Ok(())
}

async fn any_batch_of_ids_is_recorded_once_per_id(kind: StoreKind) {
    let env = StoreEnv::new(kind).await;
    let handle = tokio::runtime::Handle::current();
    let pool = pool();
    let ids = proptest::sample::select(pool);
    let strategy = (
        proptest::collection::vec(ids.clone(), 0..4),
        proptest::collection::vec(ids, 1..10),
    );
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let n = std::sync::atomic::AtomicU32::new(0);
    let result = tokio::task::block_in_place(|| {
        runner.run(&strategy, |(earlier, batch)| {
            let case_no = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let endpoint = format!("batch-ids-{case_no}");
            handle.block_on(case(&env, &endpoint, &earlier, &batch))
        })
    });
    env.finish().await;
    if let Err(e) = result {
        panic!("{e}");
    }
}

macro_rules! on_every_store {
    ($($kind:ident => $name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                any_batch_of_ids_is_recorded_once_per_id(StoreKind::$kind).await;
            }
        )*
    };
}

on_every_store!(
    Sqlite => any_batch_of_ids_on_sqlite,
    Postgres => any_batch_of_ids_on_postgres,
    Embedded => any_batch_of_ids_on_the_embedded_broker,
    PgTransport => any_batch_of_ids_on_the_postgres_transport,
);
