//! The pool the Postgres transport opens itself (`PostgresTransport::builder(url)`): it
//! tests a connection as it hands it out only when the connection has been idle for 1 s
//! or more (sqlx tests every one by default, a round trip to the server per checkout).
//! A connection that died while idle that long is found dead, closed and replaced before
//! any statement of Courier's runs on it.

use std::time::Duration;

use courier::{Envelope, PostgresTransport, QueueOptions, SenderOptions, Transport};
use courier_tests::pg_transport::database;
use sqlx::ConnectOptions;
use uuid::Uuid;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_that_died_while_idle_is_replaced_before_a_send_uses_it() {
    let name = unique("idle-pool");
    let mut url = database().await.to_url_lossy();
    url.query_pairs_mut().append_pair("application_name", &name);
    // One connection in the pool, so the send after the kill can only get that one or a
    // new one (the messages are read back with SQL: a receiver would take the pool's
    // connection for LISTEN).
    let transport = PostgresTransport::builder(url.to_string())
        .max_connections(1)
        .migrate(false)
        .open()
        .await
        .unwrap();
    let q = unique("q");
    transport.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(&q, SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("before")).await.unwrap();

    let mut admin = database().await.connect().await.unwrap();
    let killed: Vec<bool> =
        sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&name)
            .fetch_all(&mut admin)
            .await
            .unwrap();
    assert!(killed.iter().any(|k| *k), "the transport's connections were found");
    // Wall-clock time: the pool's idle time is sqlx's, not the transport's clock.
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // At its first try: the dead connection was tested, dropped and replaced.
    sender.send(Envelope::new("after")).await.unwrap();
    let bodies: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT m.body FROM courier.message m JOIN courier.entity e ON e.id = m.entity_id \
         WHERE e.name = $1 ORDER BY m.seq",
    )
    .bind(&q)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(bodies, [b"before".to_vec(), b"after".to_vec()]);
    transport.close().await;
}
