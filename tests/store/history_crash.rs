//! A workflow's history is exactly as committed as the effects it describes (issue 33):
//! a process handling a stream of jobs with a history, four at a time, is killed
//! (SIGKILL) among its commits. Its store then holds a handled event for exactly the
//! messages in its inbox (none for a handling that rolled back, none missing for one that
//! committed), and an `orders` row for each. After a restart every job has been handled
//! once: one handled event each, and a duplicate event for each redelivered one whose
//! handling had committed.

use std::collections::BTreeSet;
use std::sync::Arc;

use courier::{
    Bus, Clock, Context, Embedded, Endpoint, EntityPath, HandlerError, HistoryOptions, QueueOptions, Routes,
    SendOptions, Transport, VirtualClock,
};
use courier_tests::crash::{StoreDb, insert_order, kill_after_first_line};
use courier_tests::{CrashDone, CrashJob, eventually};

use super::Kind;

const CHILD: &str = env!("CARGO_BIN_EXE_courier-test-child");

/// The name of the child's Postgres connections.
const CHILD_APP: &str = "courier-history-child";

/// The jobs queued before the child starts.
const JOBS: u32 = 300;

/// The restarted endpoint's handler: the child's.
#[courier::handler]
async fn record_job(job: CrashJob, ctx: &mut Context) -> Result<(), HandlerError> {
    let id = format!("job-{}", job.n);
    let postgres = *ctx.state::<Kind>()? == Kind::Postgres;
    insert_order(ctx, postgres, &id).await?;
    ctx.send(&CrashDone { n: job.n })?;
    Ok(())
}

/// The message ids a query returns, as a set.
async fn ids(db: &StoreDb, sql: &str) -> BTreeSet<String> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    let rows: Vec<String> = match db {
        StoreDb::Sqlite(p) => sqlx::query_scalar(sql).fetch_all(p).await.unwrap(),
        StoreDb::Postgres(p, _) => sqlx::query_scalar(sql).fetch_all(p).await.unwrap(),
    };
    rows.into_iter().collect()
}

async fn handled_events(db: &StoreDb) -> (BTreeSet<String>, i64) {
    let table = db.history_table();
    let set = ids(db, &format!("SELECT message_id FROM {table} WHERE kind = 'handled'")).await;
    let all = db
        .count(&format!("SELECT COUNT(*) FROM {table} WHERE kind = 'handled'"))
        .await;
    (set, all)
}

async fn killed_among_commits(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("broker.db");
    {
        let broker = Embedded::open(&db).await.unwrap();
        for q in ["jobs", "done"] {
            broker.create_queue(q, &QueueOptions::default()).await.unwrap();
        }
        let transport: Arc<dyn Transport> = Arc::new(broker);
        let bus = Bus::new(transport.clone(), Routes::new().send::<CrashJob>("jobs"));
        for n in 0..JOBS {
            bus.send_with(&CrashJob { n }, SendOptions::new().message_id(format!("job-{n}")))
                .await
                .unwrap();
        }
        transport.close().await;
    }
    let (store_arg, store_db) = StoreDb::prepare(kind, dir.path(), &db).await;
    store_db.exec("CREATE TABLE orders (id TEXT NOT NULL)").await;
    // On Postgres the child's connections carry a name of their own: a COMMIT the child
    // sent just before it was killed may still be running on the server, and the test
    // reads only once they are gone.
    let store_arg = if kind == Kind::Postgres {
        let sep = if store_arg.contains('?') { '&' } else { '?' };
        format!("{store_arg}{sep}application_name={CHILD_APP}")
    } else {
        store_arg
    };
    let line = kill_after_first_line(CHILD, &["history", db.to_str().unwrap(), "jobs", &store_arg]).await;
    assert_eq!(line, "HANDLING");
    if kind == Kind::Postgres {
        eventually("the killed child's connections ended", || async {
            store_db
                .count(&format!(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{CHILD_APP}'"
                ))
                .await
                == 0
        })
        .await;
    }

    let inbox = ids(
        &store_db,
        &format!("SELECT message_id FROM {}", store_db.table("inbox")),
    )
    .await;
    let (events, all) = handled_events(&store_db).await;
    assert!(inbox.len() >= 30, "the child handled {} jobs", inbox.len());
    assert_eq!(events, inbox, "a handled event for exactly the committed handlings");
    assert_eq!(usize::try_from(all).unwrap(), events.len(), "one each");
    assert_eq!(
        ids(&store_db, "SELECT id FROM orders").await,
        inbox,
        "the effects are the committed handlings"
    );

    // Restart: every job handled once in all.
    let clock = VirtualClock::starting_now();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let broker = Embedded::builder()
        .path(&db)
        .clock(shared.clone())
        .open()
        .await
        .unwrap();
    let store = store_db.store(kind, &broker);
    let transport: Arc<dyn Transport> = Arc::new(broker);
    let running = Endpoint::builder("jobs")
        .transport(transport.clone())
        .clock(shared)
        .routes(Routes::new().send::<CrashDone>("done"))
        .store(store)
        .state(kind)
        .history(HistoryOptions::new())
        .handler(record_job)
        .start()
        .await
        .unwrap();
    eventually("every job settled", || async {
        transport.counts(&EntityPath::queue("jobs")).await.unwrap().active == 0 && running.stats().running == 0
    })
    .await;
    let (events, all) = handled_events(&store_db).await;
    assert_eq!(events.len(), JOBS as usize, "every job handled");
    assert_eq!(all, i64::from(JOBS), "once");
    assert_eq!(store_db.count("SELECT COUNT(*) FROM orders").await, i64::from(JOBS));
    let duplicates = store_db
        .count(&format!(
            "SELECT COUNT(*) FROM {} WHERE kind = 'duplicate'",
            store_db.history_table()
        ))
        .await;
    assert_eq!(
        u64::try_from(duplicates).unwrap(),
        running.stats().duplicates,
        "a duplicate event for each redelivery the inbox dropped"
    );
    running.shutdown().await.unwrap();
    transport.close().await;
    store_db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_killed_among_commits_keeps_the_history_of_what_committed() {
    killed_among_commits(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_killed_among_commits_keeps_the_history_of_what_committed() {
    killed_among_commits(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_killed_among_commits_keeps_the_history_of_what_committed() {
    killed_among_commits(Kind::Embedded).await;
}
