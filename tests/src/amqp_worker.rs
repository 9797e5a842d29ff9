//! A worker process for the RabbitMQ tests: runs the job endpoint
//! ([`courier_tests::rabbit::work`]) on RabbitMQ with a Postgres store until its standard
//! input closes, then shuts down gracefully.
//!
//! `courier-test-amqp-worker <amqp url> <postgres url> <endpoint> <instance>`: prints
//! `READY` once the endpoint receives, `DONE <completed>` after the shutdown.
//!
//! `courier-test-amqp-worker cleanup <amqp url> queues|exchanges`: deletes the queues or
//! exchanges named on standard input, one per line (`.ci/run` removes what earlier test
//! runs left on the broker with it; quorum queues are not free).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::sync::Arc;

use courier::{AmqpTransport, PostgresStore};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args[1] == "cleanup" {
        return cleanup(&args[2], &args[3]).await;
    }
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

async fn cleanup(url: &str, what: &str) {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let mut names = String::new();
    std::io::stdin().read_to_string(&mut names).unwrap();
    let mut deleted = 0;
    for name in names.lines().map(str::trim).filter(|n| !n.is_empty()) {
        // A fresh channel per name: a refusal closes the channel it happened on.
        let channel = conn.create_channel().await.unwrap();
        let done = match what {
            "queues" => channel
                .queue_delete(name.into(), QueueDeleteOptions::default())
                .await
                .is_ok(),
            _ => channel
                .exchange_delete(name.into(), ExchangeDeleteOptions::default())
                .await
                .is_ok(),
        };
        deleted += usize::from(done);
        // Bounded: a close can wait forever on a broker that stopped answering.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), channel.close(200, "done".into())).await;
    }
    println!("deleted {deleted} {what}");
}
