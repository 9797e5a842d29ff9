//! A worker process for the RabbitMQ tests: runs the job endpoint
//! ([`courier_tests::rabbit::work`]) on RabbitMQ with a Postgres store until its standard
//! input closes, then shuts down gracefully.
//!
//! `courier-test-amqp-worker <amqp url> <postgres url> <endpoint> <instance>`: prints
//! `READY` once the endpoint receives, `DONE <completed>` after the shutdown.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::sync::Arc;

use courier::{AmqpTransport, PostgresStore};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (amqp, pg, name, instance) = (&args[1], &args[2], &args[3], args[4].parse::<u32>().unwrap());
    let store = PostgresStore::connect(pg).await.unwrap();
    let transport = Arc::new(
        AmqpTransport::builder(amqp.clone())
            .schedules(&store)
            .connection_name(format!("worker-{instance}"))
            .open()
            .await
            .unwrap(),
    );
    let running = courier_tests::rabbit::job_endpoint(name, transport, &store, instance)
        .concurrency(4)
        .start()
        .await
        .unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await
    .unwrap();
    let report = running.shutdown().await.unwrap();
    println!("DONE {}", report.completed);
}
