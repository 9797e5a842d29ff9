//! Courier on the Postgres transport with the transport's own store
//! (`transport.store()`, a `PgTransportStore`): the inbox record, the handler's writes and
//! sends and the completion of the received message in one transaction per message, or
//! per group with `group_commit(g)`. Two handlers ([`Work`]): the peers' (insert one row)
//! and the PeekLock baseline's (update one saga row, send one 1 KiB message).

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::PostgresTransport;
use courier::prelude::*;
use courier::test_servers::TestDatabase;

use crate::common::{
    CREATE_ORDERS, CREATE_SAGA, CpuMark, Drain, FILL_SAGA, INSERT_ORDER, PlaceOrder, Progress, SAGA_ROWS, Shipment,
    UPDATE_SAGA, admin_connection, completed, courier_transport, fresh_database, order_bytes, order_key, xacts,
};

/// What the handler does with each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// Insert one row: the handler the peers run too.
    Row,
    /// The work of `scripts/baselines/peeklock-baseline.sh`: update one saga row and send
    /// one 1 KiB message from the handler (the inbox record is the store's, as there).
    PeekLock,
    /// The peers' row per message, by a batch handler of up to `.0` messages, `.1` batches
    /// at once, with ONE multi-row insert per batch (issue 32, part 2).
    Batch(usize, usize),
}

/// The queue the [`Work::PeekLock`] handler sends its [`Shipment`] to (nobody reads it).
const SHIPMENTS: &str = "shipments";

/// A count of the transport's messages in `queue` (a name of the bench's own).
fn in_queue(queue: &str) -> String {
    format!(
        "SELECT count(*) FROM courier.message m JOIN courier.entity e ON e.id = m.entity_id \
         WHERE e.path = '{queue}'"
    )
}

/// The handler: read the message, insert one row in the unit of work's transaction.
/// (Completing the message is the endpoint's, in the same transaction.)
#[courier::handler]
pub(crate) async fn place(order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    let tx = ctx.transaction::<courier::sqlx::Postgres>()?;
    sqlx::query(INSERT_ORDER)
        .bind(order_key(order.n))
        .bind(order_bytes(&order.payload))
        .execute(&mut *tx)
        .await?;
    ctx.state::<Arc<Progress>>()?.tick();
    Ok(())
}

/// The batch handler: one `INSERT ... SELECT FROM unnest(...)` for the batch's rows, in
/// the batch's transaction (which also records every message in the inbox and completes
/// them).
#[courier::handler]
pub(crate) async fn place_batch(orders: Batch<PlaceOrder>, ctx: &mut BatchContext) -> Result<(), HandlerError> {
    let keys: Vec<i64> = orders.messages().iter().map(|o| order_key(o.n)).collect();
    let bytes: Vec<i32> = orders.messages().iter().map(|o| order_bytes(&o.payload)).collect();
    let tx = ctx.transaction::<courier::sqlx::Postgres>()?;
    sqlx::query("INSERT INTO orders (n, bytes) SELECT * FROM unnest($1::int8[], $2::int4[])")
        .bind(&keys)
        .bind(&bytes)
        .execute(&mut *tx)
        .await?;
    let progress = ctx.state::<Arc<Progress>>()?;
    for _ in 0..keys.len() {
        progress.tick();
    }
    Ok(())
}

/// The PeekLock baseline's handler: one saga row updated in the unit of work's
/// transaction, one 1 KiB message sent (inserted into its queue in the same transaction).
#[courier::handler]
pub(crate) async fn ship(order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    let tx = ctx.transaction::<courier::sqlx::Postgres>()?;
    sqlx::query(UPDATE_SAGA)
        .bind(saga_of(order.n))
        .execute(&mut *tx)
        .await?;
    ctx.send(&Shipment::new(order.n))?;
    ctx.state::<Arc<Progress>>()?.tick();
    Ok(())
}

/// The saga row of order `n`, as the baseline picks it (`id % 10000`).
fn saga_of(n: u64) -> i32 {
    i32::try_from(n % SAGA_ROWS).unwrap_or(0)
}

/// A transport on a fresh database with queue `orders` and the handlers' tables. With
/// `--log-statements`, the server logs every statement run in that database
/// (`log_statement = 'all'`, set on the database alone), to count them per message; with
/// `--schema-sql FILE`,
/// the SQL in FILE runs on the database once the transport opened it (to measure what a
/// piece of Courier's schema costs, for example its foreign key).
pub(crate) async fn open(pool: u32) -> (TestDatabase, PostgresTransport) {
    let db = fresh_database().await;
    if std::env::args().any(|a| a == "--log-statements") {
        let set = format!("ALTER DATABASE \"{}\" SET log_statement = 'all'", db.name());
        sqlx::query(sqlx::AssertSqlSafe(set))
            .execute(&mut admin_connection().await)
            .await
            .unwrap();
        println!("    logging every statement of database {}", db.name());
    }
    let transport = courier_transport(db.url(), pool)
        .open()
        .await
        .expect("open the Postgres transport");
    transport
        .create_queue("orders", &QueueOptions::default())
        .await
        .unwrap();
    transport
        .create_queue(SHIPMENTS, &QueueOptions::default())
        .await
        .unwrap();
    for statement in [CREATE_ORDERS, CREATE_SAGA, FILL_SAGA, "VACUUM ANALYZE saga"] {
        sqlx::query(statement).execute(transport.pool()).await.unwrap();
    }
    if let Some(file) = crate::arg::<String>("--schema-sql") {
        let sql = std::fs::read_to_string(&file).expect("read the --schema-sql file");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(transport.pool())
            .await
            .expect("run the --schema-sql file");
        println!("    ran {file} on database {}", db.name());
    }
    (db, transport)
}

/// Sends orders `from..to` to queue `orders`, 100 to a batch.
pub(crate) async fn send_orders(sender: &Arc<dyn Sender>, from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let batch: Vec<Envelope> = (i..(i + 100).min(to))
            .map(|k| PlaceOrder::new(k).to_envelope().unwrap())
            .collect();
        i += batch.len() as u64;
        sender.send_batch(batch).await.unwrap();
    }
}

/// Drains `n` prefilled messages with `handlers` at once and `group_commit(group)`, each
/// handled with `work`.
pub(crate) async fn drain(n: u64, handlers: usize, group: usize, pool: u32, work: Work) -> Drain {
    let (db, transport) = open(pool).await;
    let sender = transport.sender("orders", SenderOptions::default()).await.unwrap();
    send_orders(&sender, 0, n).await;
    let mut admin = admin_connection().await;
    let before = xacts(&mut admin, db.name()).await;

    let progress = Arc::new(Progress::new(n));
    let start = Instant::now();
    let cpu = CpuMark::now();
    let builder = Endpoint::builder("orders")
        .transport(transport.clone())
        .store(transport.store())
        .state(progress.clone())
        .concurrency(handlers)
        .group_commit(group);
    let builder = match work {
        Work::Row => builder.handler(place),
        Work::PeekLock => builder.routes(Routes::new().send::<Shipment>(SHIPMENTS)).handler(ship),
        Work::Batch(max, at_once) => builder.batch_handler(
            place_batch,
            BatchOptions::new()
                .max_messages(max)
                .max_wait(Duration::from_millis(50))
                .concurrency(at_once),
        ),
    };
    let running = builder.start().await.unwrap();
    progress.done.notified().await;
    completed(transport.pool(), &in_queue("orders")).await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let cpu = cpu.per_message(n);
    let stopping = Instant::now();
    let report = running.shutdown().await.unwrap();
    let shutdown = stopping.elapsed();
    assert_eq!(report.completed, n, "every message completed");

    let (rows, updates): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM orders), (SELECT sum(state)::int8 FROM saga)")
            .fetch_one(transport.pool())
            .await
            .unwrap();
    let sent: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(in_queue(SHIPMENTS)))
        .fetch_one(transport.pool())
        .await
        .unwrap();
    let expected = match work {
        Work::Row | Work::Batch(..) => (order_key(n), 0, 0),
        Work::PeekLock => (0, order_key(n), order_key(n)),
    };
    assert_eq!(
        (rows, updates, sent),
        expected,
        "rows inserted, saga updates, messages sent"
    );
    let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(in_queue("orders")))
        .fetch_one(transport.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "every message completed and deleted");
    // Closed connections flush their statistics.
    transport.close().await;
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
