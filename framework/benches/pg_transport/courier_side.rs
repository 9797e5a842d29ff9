//! Courier on the Postgres transport with the transport's own store
//! (`transport.store()`, a `PgTransportStore`): the inbox record, the handler's row and
//! the completion of the received message in one transaction per message, or per group
//! with `group_commit(g)`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::PostgresTransport;
use courier::prelude::*;
use courier::test_servers::TestDatabase;

use crate::common::{
    CREATE_ORDERS, Drain, INSERT_ORDER, PlaceOrder, Progress, admin_connection, completed, fresh_database, order_bytes,
    order_key, xacts,
};

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

/// A transport on a fresh database with queue `orders` and the handler's table.
pub(crate) async fn open(pool: u32) -> (TestDatabase, PostgresTransport) {
    let db = fresh_database().await;
    let transport = PostgresTransport::builder(db.url())
        .max_connections(pool)
        .open()
        .await
        .expect("open the Postgres transport");
    transport
        .create_queue("orders", &QueueOptions::default())
        .await
        .unwrap();
    sqlx::query(CREATE_ORDERS).execute(transport.pool()).await.unwrap();
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

/// Drains `n` prefilled messages with `handlers` at once and `group_commit(group)`.
pub(crate) async fn drain(n: u64, handlers: usize, group: usize, pool: u32) -> Drain {
    let (db, transport) = open(pool).await;
    let sender = transport.sender("orders", SenderOptions::default()).await.unwrap();
    send_orders(&sender, 0, n).await;
    let mut admin = admin_connection().await;
    let before = xacts(&mut admin, db.name()).await;

    let progress = Arc::new(Progress::new(n));
    let start = Instant::now();
    let running = Endpoint::builder("orders")
        .transport(transport.clone())
        .store(transport.store())
        .state(progress.clone())
        .concurrency(handlers)
        .group_commit(group)
        .handler(place)
        .start()
        .await
        .unwrap();
    progress.done.notified().await;
    completed(transport.pool(), "SELECT count(*) FROM courier.message").await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let stopping = Instant::now();
    let report = running.shutdown().await.unwrap();
    let shutdown = stopping.elapsed();
    assert_eq!(report.completed, n, "every message completed");

    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(transport.pool())
        .await
        .unwrap();
    assert_eq!(rows, order_key(n), "one row per message");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.message")
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
    }
}
