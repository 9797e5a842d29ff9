//! What the RabbitMQ endpoint tests share: a job whose effect is a row in Postgres, a
//! database per test, transports, endpoints.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use courier::{
    AmqpTransport, Clock, EndpointBuilder, EntityPath, PostgresStore, Routes, RunningEndpoint, Store, Transport,
    VirtualClock,
};
use courier_tests::pg::TestDatabase;
use courier_tests::rabbit::amqp_url;

pub use courier_tests::rabbit::Job;

/// A database with Courier's tables and `effects`.
pub async fn database() -> (TestDatabase, PostgresStore) {
    let db = TestDatabase::create().await;
    let store = PostgresStore::from_pool(db.pool().await);
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE effects (n bigint NOT NULL, instance bigint NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    (db, store)
}

pub async fn rabbit(store: &PostgresStore, clock: Option<&VirtualClock>) -> Arc<AmqpTransport> {
    let mut b = AmqpTransport::builder(amqp_url().await).schedules(store);
    if let Some(c) = clock {
        let c: Arc<dyn Clock> = Arc::new(c.clone());
        b = b.clock(c);
    }
    Arc::new(b.open().await.unwrap())
}

/// `host:port` and the user info of the test broker's URL.
pub fn broker_parts(url: &str) -> (String, String) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (userinfo, hostpart) = rest.rsplit_once('@').unwrap_or(("guest:guest", rest));
    let host = hostpart.split('/').next().unwrap_or(hostpart).to_owned();
    (host, userinfo.to_owned())
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

pub fn routes(queue: &str, done_topic: &str) -> Routes {
    courier_tests::rabbit::job_routes(queue, done_topic)
}

pub fn endpoint(name: &str, transport: Arc<AmqpTransport>, store: &PostgresStore, instance: u32) -> EndpointBuilder {
    courier_tests::rabbit::job_endpoint(name, transport, store, instance)
}

pub async fn effects(store: &PostgresStore) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), count(DISTINCT n) FROM effects")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

pub async fn wait_effects(store: &PostgresStore, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (all, distinct) = effects(store).await;
        assert_eq!(all, distinct, "a job had its effect twice");
        if distinct == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{distinct} of {n} jobs had their effect within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn send_jobs(endpoint: &RunningEndpoint, range: std::ops::Range<u32>) {
    for n in range {
        endpoint.bus().send(&Job { n }).await.unwrap();
    }
}

pub async fn cleanup(transport: &AmqpTransport, name: &str) {
    let _ = transport.delete(&EntityPath::queue(name)).await;
    let topic = format!("{name}-done");
    let _ = transport.delete(&EntityPath::queue(&topic)).await;
}
