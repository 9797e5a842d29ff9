//! The `courier` command on RabbitMQ (a virtual host of its own on the test broker): queues
//! from the schedule store, dead letters read and resubmitted, a dry run and a page past
//! the end that move nothing, a refused login, and the management API's `LOCKED`.

use std::process::{Command, Stdio};
use std::time::Duration;

use courier::{EntityPath, Envelope, QueueOptions, SenderOptions, SqliteStore, Store, Transport};

use super::{courier, dead_letter_on, json_of, unique};

#[tokio::test]
async fn rabbitmq_queues_are_listed_from_the_schedule_store_and_dead_letters_resubmitted() {
    // A virtual host of its own on the test broker (AMQP_URL, or a container).
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let amqp = vhost.url().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    let transport = courier::AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let queue = unique("cli-orders");
    dead_letter_on(&transport, &queue, 2).await;
    // Its receiver's consumer would take the resubmitted messages (RabbitMQ counts only
    // the ready ones): closed, and a transport without a consumer counts afterwards.
    transport.close().await;
    let transport = courier::AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let f = file.to_str().unwrap();
    let rabbit = ["--rabbitmq", amqp.as_str(), "--sqlite", f];
    let run = |args: &[&str]| courier(&[&rabbit[..], args].concat(), "");

    let queues = json_of(&run(&["--json", "queues"]));
    assert_eq!(queues[0]["name"], queue.as_str());
    assert_eq!(queues[0]["dead_lettered"], 2);
    let ran = run(&["queues"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains(&queue), "{}", ran.stdout);

    let page = json_of(&run(&["--json", "dlq", "list", &queue]));
    assert_eq!(page["total"], 2);
    let mut ids: Vec<&str> = (0..2)
        .map(|i| page["items"][i]["message_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["order-0", "order-1"]);
    let seq = page["items"][0]["sequence_number"].as_i64().unwrap();
    let shown = json_of(&run(&["--json", "dlq", "show", &queue, &seq.to_string()]));
    assert_eq!(shown["reason"], "test.Poison");

    // Reading moves nothing (issue 31): a dry run of --all, a page past the end.
    let ran = run(&["dlq", "delete", &queue, "--all", "--dry-run"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("dry run: 2 dead letters"), "{}", ran.stdout);
    let past = json_of(&run(&["--json", "dlq", "list", &queue, "--after", "10000"]));
    assert_eq!(
        (past["total"].as_u64(), past["items"].as_array().map(Vec::len)),
        (Some(2), Some(0))
    );
    let c = transport.counts(&EntityPath::queue(&queue)).await.unwrap();
    assert_eq!(c.dead_lettered, 2, "still in RabbitMQ's dead-letter queue");

    let ran = run(&["--yes", "dlq", "resubmit", &queue, "--all"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    // RabbitMQ's counts follow the acknowledgements a moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let c = transport.counts(&EntityPath::queue(&queue)).await.unwrap();
        if (c.active, c.dead_lettered) == (2, 0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "counts stay {c:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The password is never printed (the user name is).
    let ran = run(&["dlq", "list", "no-such-queue"]);
    assert_eq!(ran.code, 3, "{}", ran.stderr);
    let password = amqp
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .and_then(|(u, _)| u.split_once(':'));
    if let Some((_, password)) = password {
        assert!(!ran.stderr.contains(&format!(":{password}@")), "{}", ran.stderr);
    }
    // Without a store, the operator names the queue.
    let queues = json_of(&courier(
        &[
            "--rabbitmq",
            amqp.as_str(),
            "--rabbitmq-queue",
            &queue,
            "--json",
            "queues",
        ],
        "",
    ));
    assert_eq!(queues[0]["active"], 2);
    // Without a store, dead letters cannot be read: the error says what to add.
    let ran = courier(&["--rabbitmq", amqp.as_str(), "dlq", "list", &queue], "");
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    assert!(ran.stderr.contains("--postgres URL or --sqlite FILE"), "{}", ran.stderr);
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
    transport.close().await;
    vhost.delete().await.unwrap();
}

#[tokio::test]
async fn rabbitmq_a_refused_login_fails_at_once_in_one_line() {
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let url = vhost.url().to_owned();
    // The same URL with a wrong password.
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, host) = rest.split_once('@').unwrap();
    let user = user.split_once(':').map_or(user, |(u, _)| u);
    let bad = format!("{scheme}://{user}:not-the-password@{host}");
    let ran = courier(&["--rabbitmq", &bad, "queues"], "");
    assert_eq!(ran.code, 5, "{}", ran.stderr);
    let lines: Vec<&str> = ran.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line, no retries: {}", ran.stderr);
    assert!(lines[0].contains("refused the connection"), "{}", ran.stderr);
    assert!(!ran.stderr.contains("not-the-password"), "{}", ran.stderr);
    vhost.delete().await.unwrap();
}

#[tokio::test]
async fn rabbitmq_locked_comes_from_the_management_api_and_no_password_is_printed() {
    // A virtual host of its own on the test broker, and that broker's management API
    // (the container's image has the plugin on; with AMQP_URL, RABBITMQ_MANAGEMENT_URL
    // or port 15672 of its host).
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let amqp = vhost.url().to_owned();
    let management = vhost.management_url().to_owned();
    let db = courier::test_servers::postgres_database().await.unwrap();
    let store = courier::PostgresStore::connect(&db.url()).await.unwrap();
    store.migrate().await.unwrap();
    let transport = courier::AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let queue = unique("cli-held");
    transport.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(&queue, SenderOptions::default()).await.unwrap();
    for i in 0..5 {
        sender.send(Envelope::new(format!("{{\"id\":{i}}}"))).await.unwrap();
    }
    // Two received and not settled: RabbitMQ counts them unacknowledged.
    let receiver = transport.receiver(&EntityPath::queue(&queue)).await.unwrap();
    let mut held = Vec::new();
    while held.len() < 2 {
        held.extend(receiver.receive(2 - held.len(), Duration::from_secs(5)).await.unwrap());
    }
    let pg = db.url();
    let with = |args: &[&str]| {
        let base = [
            "--rabbitmq",
            amqp.as_str(),
            "--rabbitmq-management",
            management.as_str(),
            "--postgres",
            pg.as_str(),
        ];
        courier(&[&base[..], args].concat(), "")
    };
    // The API's statistics are refreshed every few seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let queues = json_of(&with(&["--json", "queues"]));
        let q = queues
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == queue.as_str())
            .unwrap()
            .clone();
        if (q["locked"].as_u64(), q["active"].as_u64()) == (Some(2), Some(3)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{q}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let ran = with(&["queues"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let row: Vec<&str> = ran
        .stdout
        .lines()
        .find(|l| l.starts_with(&queue))
        .unwrap()
        .split_whitespace()
        .collect();
    // NAME KIND ACTIVE LOCKED SCHEDULED DEFERRED DEAD OLDEST: a quorum queue has no oldest age.
    assert_eq!(
        row,
        [queue.as_str(), "queue", "3", "2", "0", "0", "0", "-"],
        "{}",
        ran.stdout
    );

    // The same from the environment, with a management URL that has no user and password:
    // the AMQP URL's are used.
    let bare = management
        .split_once("://")
        .map(|(scheme, rest)| format!("{scheme}://{}", rest.rsplit_once('@').map_or(rest, |(_, h)| h)))
        .unwrap();
    let amqp_credentials = amqp
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .map(|(u, _)| u);
    let management_credentials = management
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .map(|(u, _)| u);
    if amqp_credentials == management_credentials {
        let child = Command::new(env!("CARGO_BIN_EXE_courier"))
            .args([
                "--rabbitmq",
                amqp.as_str(),
                "--postgres",
                pg.as_str(),
                "--json",
                "queues",
            ])
            .env_remove("COURIER_EMBEDDED")
            .env_remove("COURIER_POSTGRES")
            .env_remove("COURIER_SQLITE")
            .env_remove("COURIER_RABBITMQ")
            .env("COURIER_RABBITMQ_MANAGEMENT", &bare)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let queues: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let q = queues
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == queue.as_str())
            .unwrap();
        assert_eq!(q["locked"], 2, "{q}");
    }

    // An unreachable management API: the AMQP counts, exit 0, a warning that says what to
    // do and never the password; a bad URL: a usage error, without the password either.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let secret = "hunter2-mgmt";
    let down = format!("http://ops:{secret}@127.0.0.1:{closed}");
    let base = [
        "--rabbitmq",
        amqp.as_str(),
        "--postgres",
        pg.as_str(),
        "--rabbitmq-management",
    ];
    let ran = courier(&[&base[..], &[down.as_str(), "queues"]].concat(), "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let row: Vec<&str> = ran
        .stdout
        .lines()
        .find(|l| l.starts_with(&queue))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(row[2..4], ["3", "0"], "{}", ran.stdout);
    assert!(
        ran.stderr.contains("rabbitmq-plugins enable rabbitmq_management"),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("http://ops:***@127.0.0.1:"), "{}", ran.stderr);
    let bad = format!("https://ops:{secret}@127.0.0.1:15671");
    let refused = courier(&[&base[..], &[bad.as_str(), "queues"]].concat(), "");
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("HTTPS management endpoints are not supported"),
        "{}",
        refused.stderr
    );
    // Given after the command (a global option), it works as well; without --rabbitmq,
    // it is a usage error.
    let after = courier(
        &[
            "--rabbitmq",
            amqp.as_str(),
            "--postgres",
            pg.as_str(),
            "queues",
            "--rabbitmq-management",
            management.as_str(),
        ],
        "",
    );
    assert_eq!(after.code, 0, "{}", after.stderr);
    let alone = courier(
        &[
            "--postgres",
            pg.as_str(),
            "--rabbitmq-management",
            down.as_str(),
            "queues",
        ],
        "",
    );
    assert_eq!(alone.code, 2, "{}", alone.stderr);
    assert!(alone.stderr.contains("needs --rabbitmq URL"), "{}", alone.stderr);
    let amqp_password = amqp_credentials
        .and_then(|c| c.split_once(':'))
        .map(|(_, p)| p.to_owned());
    let management_password = management_credentials
        .and_then(|c| c.split_once(':'))
        .map(|(_, p)| p.to_owned());
    for ran in [&ran, &refused, &alone, &after, &with(&["queues"])] {
        for text in [&ran.stdout, &ran.stderr] {
            assert!(!text.contains(secret), "{text}");
            for password in [&amqp_password, &management_password].into_iter().flatten() {
                assert!(!text.contains(&format!(":{password}@")), "{text}");
            }
        }
    }
    drop(held);
    drop(receiver);
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
    transport.close().await;
    store.pool().close().await;
    db.drop_database().await.unwrap();
    vhost.delete().await.unwrap();
}
