//! The same handler on two peers, each on a fresh database of the same server, each with
//! its own defaults but for the number of jobs handled at once and the pool size (the same
//! as Courier's): apalis with its Postgres storage (apalis-postgres) and graphile_worker.
//!
//! graphile_worker runs with its LocalQueue (`LocalQueueConfig::default()`: batches of up
//! to 100 jobs fetched ahead), its mode for throughput. In its default, direct mode each
//! job slot fetches one job per signal, and the signals are its poll interval (1 s) and
//! the `NOTIFY` of each insert: a backlog that was there before the worker started drains
//! at `concurrency` jobs a second (8 msg/s seen with 8 slots).
//! The handler reads the job (decoded by the peer), inserts one row on the peer's pool,
//! and returns; the peer then completes the job.
//!
//! Neither peer runs the handler's write and the completion in one transaction: the row
//! commits first, the completion after (apalis marks the job `Done` in batches of
//! completions; graphile_worker deletes it, one statement per job by default).

use std::sync::Arc;
use std::time::{Duration, Instant};

use apalis::prelude::{BoxDynError, Data, TaskSink, WorkerBuilder, WorkerBuilderExt};
use apalis_postgres::PostgresStorage;
use graphile_worker::{IntoTaskHandlerResult, JobSpec, LocalQueueConfig, TaskHandler, WorkerContext, WorkerOptions};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

use crate::common::{
    CREATE_ORDERS, CpuMark, Drain, INSERT_ORDER, PlaceOrder, Progress, admin_connection, completed, fresh_database,
    order_bytes, order_key, xacts,
};

/// What an apalis handler gets besides the job.
#[derive(Clone)]
struct ApalisState {
    pool: sqlx::PgPool,
    progress: Arc<Progress>,
}

async fn apalis_place(order: PlaceOrder, state: Data<ApalisState>) -> Result<(), BoxDynError> {
    sqlx::query(INSERT_ORDER)
        .bind(order_key(order.n))
        .bind(order_bytes(&order.payload))
        .execute(&state.pool)
        .await?;
    state.progress.tick();
    Ok(())
}

/// Drains `n` prefilled jobs through one apalis worker with `handlers` at once.
pub(crate) async fn apalis(n: u64, handlers: usize, pool_size: u32) -> Drain {
    let db = fresh_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .connect(&db.url())
        .await
        .unwrap();
    PostgresStorage::setup(&pool).await.expect("apalis-postgres migrations");
    sqlx::query(CREATE_ORDERS).execute(&pool).await.unwrap();
    let mut storage =
        PostgresStorage::<PlaceOrder>::new(&pool).with_config(apalis_postgres::Config::default().queue("orders"));
    let mut i = 0;
    while i < n {
        let batch: Vec<PlaceOrder> = (i..(i + 100).min(n)).map(PlaceOrder::new).collect();
        i += batch.len() as u64;
        storage.push_bulk(batch).await.expect("push jobs");
    }
    let mut admin = admin_connection().await;
    let before = xacts(&mut admin, db.name()).await;

    let progress = Arc::new(Progress::new(n));
    let start = Instant::now();
    let cpu = CpuMark::now();
    let worker = WorkerBuilder::new("bench")
        .backend(storage)
        .data(ApalisState {
            pool: pool.clone(),
            progress: progress.clone(),
        })
        .concurrency(handlers)
        .build(apalis_place);
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let running = tokio::spawn(worker.run_until(async move {
        stopped.notified().await;
        Ok::<(), std::io::Error>(())
    }));
    progress.done.notified().await;
    completed(&pool, "SELECT count(*) FROM apalis.jobs WHERE status <> 'Done'").await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let cpu = cpu.per_message(n);
    let stopping = Instant::now();
    stop.notify_one();
    running.await.unwrap().expect("the apalis worker ran");
    let shutdown = stopping.elapsed();
    assert_eq!(progress.seen(), n, "each job handled once");

    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, order_key(n), "one row per job");
    let done: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs WHERE status = 'Done'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(done, order_key(n), "every job completed by the end of the shutdown");
    pool.close().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tx_per_msg = (xacts(&mut admin, db.name()).await - before) as f64 / n as f64;
    db.drop_database().await.unwrap();
    Drain {
        rate,
        shutdown,
        tx_per_msg,
        cpu,
    }
}

/// The graphile_worker job: the same fields as [`PlaceOrder`].
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GraphileOrder {
    n: u64,
    payload: String,
}

/// What a graphile_worker handler gets besides the job (an extension of the worker).
#[derive(Debug, Clone)]
struct GraphileState(Arc<Progress>);

impl TaskHandler for GraphileOrder {
    const IDENTIFIER: &'static str = "place_order";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        sqlx::query(INSERT_ORDER)
            .bind(order_key(self.n))
            .bind(order_bytes(&self.payload))
            .execute(ctx.pg_pool())
            .await
            .map_err(|e| e.to_string())?;
        if let Some(state) = ctx.get_ext::<GraphileState>() {
            state.0.tick();
        }
        Ok::<(), String>(())
    }
}

/// Drains `n` prefilled jobs through one graphile_worker worker with `handlers` at once.
pub(crate) async fn graphile(n: u64, handlers: usize, pool_size: u32) -> Drain {
    let db = fresh_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .connect(&db.url())
        .await
        .unwrap();
    sqlx::query(CREATE_ORDERS).execute(&pool).await.unwrap();
    let progress = Arc::new(Progress::new(n));
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let worker = WorkerOptions::default()
        .pg_pool(pool.clone())
        .schema("graphile_worker")
        .concurrency(handlers)
        .define_job::<GraphileOrder>()
        .add_extension(GraphileState(progress.clone()))
        .listen_os_shutdown_signals(false)
        .local_queue(LocalQueueConfig::default())
        .shutdown_signal(async move { stopped.notified().await })
        .init()
        .await
        .expect("graphile_worker migrations");
    let utils = worker.create_utils();
    let spec = JobSpec::default();
    let mut i = 0;
    while i < n {
        let batch: Vec<(GraphileOrder, &JobSpec)> = (i..(i + 100).min(n))
            .map(|k| {
                let o = PlaceOrder::new(k);
                (
                    GraphileOrder {
                        n: o.n,
                        payload: o.payload,
                    },
                    &spec,
                )
            })
            .collect();
        i += batch.len() as u64;
        utils.add_jobs(&batch).await.expect("add jobs");
    }
    let mut admin = admin_connection().await;
    let before = xacts(&mut admin, db.name()).await;

    let start = Instant::now();
    let cpu = CpuMark::now();
    let worker = Arc::new(worker);
    let running = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run().await }
    });
    progress.done.notified().await;
    completed(&pool, "SELECT count(*) FROM graphile_worker._private_jobs").await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let cpu = cpu.per_message(n);
    let stopping = Instant::now();
    stop.notify_one();
    running.await.unwrap().expect("the graphile_worker worker ran");
    let shutdown = stopping.elapsed();
    assert_eq!(progress.seen(), n, "each job handled once");

    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, order_key(n), "one row per job");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM graphile_worker._private_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "every job completed (deleted) by the end of the shutdown");
    drop(worker);
    pool.close().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tx_per_msg = (xacts(&mut admin, db.name()).await - before) as f64 / n as f64;
    db.drop_database().await.unwrap();
    Drain {
        rate,
        shutdown,
        tx_per_msg,
        cpu,
    }
}
