//! `courier::test_servers`, the fixtures users' tests get servers from: each call gives a
//! fresh database or virtual host, apart from the others, which the test then removes.

use std::time::Duration;

use courier::test_servers::{postgres_database, rabbitmq_vhost};
use courier::{AmqpTransport, EntityPath, Message, QueueOptions, SenderOptions, Transport};

use crate::support::Job;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_test_gets_a_database_and_a_vhost_of_its_own() {
    // Containers, when it starts them, from the images the rest of the suite uses (the
    // repository's own unless COURIER_TEST_*_IMAGE names others): no registry needed.
    courier_tests::containers::images_for_test_servers();
    let (a, b) = (postgres_database().await.unwrap(), postgres_database().await.unwrap());
    assert_ne!(a.name(), b.name());
    let pool_a = a.pool(2).await.unwrap();
    sqlx::query("CREATE TABLE mine (n int)").execute(&pool_a).await.unwrap();
    let pool_b = b.pool(2).await.unwrap();
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
            .fetch_one(&pool_b)
            .await
            .unwrap();
    assert_eq!(tables, 0, "the second database is fresh");
    pool_a.close().await;
    pool_b.close().await;

    let (x, y) = (rabbitmq_vhost().await.unwrap(), rabbitmq_vhost().await.unwrap());
    let tx = AmqpTransport::builder(x.url()).open().await.unwrap();
    let ty = AmqpTransport::builder(y.url()).open().await.unwrap();
    for t in [&tx, &ty] {
        t.create_queue("jobs", &QueueOptions::default()).await.unwrap();
    }
    let sender = tx.sender("jobs", SenderOptions::default()).await.unwrap();
    sender.send(Job { n: 7 }.to_envelope().unwrap()).await.unwrap();
    let in_y = ty
        .receiver(&EntityPath::queue("jobs"))
        .await
        .unwrap()
        .receive_and_delete(10, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(
        in_y.is_empty(),
        "the other vhost's queue of the same name is another queue"
    );
    let in_x = tx
        .receiver(&EntityPath::queue("jobs"))
        .await
        .unwrap()
        .receive_and_delete(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(in_x.len(), 1);
    drop((tx, ty));

    for v in [x, y] {
        v.delete().await.unwrap();
    }
    a.drop_database().await.unwrap();
    b.drop_database().await.unwrap();
}

/// A test binary says once which servers it uses, without their passwords: a child
/// process (`courier-test-child databases`, which makes a database and, with `AMQP_URL`,
/// a vhost) is read on its standard error.
#[test]
fn a_test_binary_says_which_servers_it_uses() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};

    let mut command = Command::new(env!("CARGO_BIN_EXE_courier-test-child"));
    command.arg("databases").stdout(Stdio::piped()).stderr(Stdio::piped());
    // A password, which the line must not show (the local server trusts its users).
    if let Ok(url) = std::env::var("DATABASE_URL") {
        command.env("DATABASE_URL", url.replacen("postgres@", "postgres:pg-secret@", 1));
    }
    let mut child = command.spawn().unwrap();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let mut said = String::new();
    child.stderr.take().unwrap().read_to_string(&mut said).unwrap();
    assert!(
        ready.starts_with("READY"),
        "the child made its servers: {ready}\n{said}"
    );
    let lines: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("courier::test_servers:"))
        .collect();
    let postgres: Vec<&&str> = lines.iter().filter(|l| l.contains(": Postgres: ")).collect();
    assert_eq!(postgres.len(), 1, "one line for Postgres: {said}");
    let expected_source = if std::env::var_os("DATABASE_URL").is_some() {
        "DATABASE_URL (postgres@"
    } else {
        "container "
    };
    assert!(postgres[0].contains(expected_source), "{}", postgres[0]);
    if std::env::var_os("AMQP_URL").is_some() {
        let rabbit: Vec<&&str> = lines.iter().filter(|l| l.contains(": RabbitMQ: AMQP_URL (")).collect();
        assert_eq!(rabbit.len(), 1, "one line for RabbitMQ: {said}");
    }
    assert!(
        !said.contains("pg-secret") && !said.contains("guest:guest"),
        "no password is shown: {said}"
    );
}
