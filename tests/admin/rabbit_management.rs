//! `AmqpAdmin::with_management` against the real broker and its management plugin
//! (tests/src/rabbit.rs: the container's image has it on; with `AMQP_URL`,
//! `RABBITMQ_MANAGEMENT_URL` or port 15672 of that host): messages a receiver holds
//! unsettled are `locked`, the rest `active`; a quorum queue has no oldest age, a classic
//! one its head message's timestamp; an unreachable API or refused credentials leave
//! the AMQP counts and log one warning a listing; a bad URL is refused when the admin is
//! built. Each test has its own queue names.

use std::time::Duration;

use courier::admin::{AdminError, AmqpAdmin, EntityKind, QueueAdmin, QueueSummary};
use courier::{
    AmqpTransport, EntityPath, Envelope, QueueOptions, ScheduleStore, SenderOptions, Transport, VirtualClock,
};
use courier_tests::logs::Logs;
use courier_tests::rabbit::{amqp_url, management_url, memory_store, transport};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// The admin's warning when the API gives nothing.
const WARNING: &str = "the RabbitMQ management API gave no statistics";

/// A transport with a schedule store in memory (the queues it declares are recorded and
/// listed), and `queue` declared with `n` messages in it.
async fn queue_with(queue: &str, n: usize) -> AmqpTransport {
    let clock = VirtualClock::starting_now();
    let store = memory_store().await;
    let t = transport(&clock, ScheduleStore::from(&store)).await;
    t.create_queue(queue, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(queue, SenderOptions::default()).await.unwrap();
    let batch: Vec<Envelope> = (0..n).map(|i| Envelope::new(format!("{{\"n\":{i}}}"))).collect();
    sender.send_batch(batch).await.unwrap();
    t
}

async fn summary(admin: &AmqpAdmin, queue: &str) -> QueueSummary {
    admin
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.name == queue)
        .unwrap_or_else(|| panic!("{queue} is not listed"))
}

/// Lists until `check` holds for `queue` (the management API's statistics are refreshed
/// every `collect_statistics_interval`: 500 ms in the test image, 5 s by default), at a
/// pace that does not flood the API; the last summary.
async fn until(admin: &AmqpAdmin, queue: &str, what: &str, check: impl Fn(&QueueSummary) -> bool) -> QueueSummary {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let q = summary(admin, queue).await;
        if check(&q) {
            return q;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {q:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `http://user:password@host:port` -> `http://host:port` when its user and password
/// are the AMQP URL's (so the admin falls back to those), else `None`.
fn without_credentials(management: &str, amqp: &str) -> Option<String> {
    let userinfo = |url: &str| {
        url.split_once("://")
            .and_then(|(_, rest)| rest.split('/').next())
            .and_then(|authority| authority.rsplit_once('@'))
            .map(|(u, _)| u.to_owned())
    };
    let (scheme, rest) = management.split_once("://")?;
    let (credentials, host) = rest.rsplit_once('@')?;
    (Some(credentials.to_owned()) == userinfo(amqp)).then(|| format!("{scheme}://{host}"))
}

/// A port on loopback where nothing listens.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn rabbit_management_messages_held_unsettled_are_locked_and_the_rest_active() {
    let queue = unique("rbmgmt-held");
    let t = queue_with(&queue, 5).await;
    let receiver = t.receiver(&EntityPath::queue(&queue)).await.unwrap();
    let mut held = Vec::new();
    while held.len() < 3 {
        held.extend(receiver.receive(3 - held.len(), Duration::from_secs(5)).await.unwrap());
    }
    let management = management_url().await;
    let admin = AmqpAdmin::new(&t).with_management(&management).unwrap();
    let q = until(&admin, &queue, "3 locked, 2 active", |q| (q.locked, q.active) == (3, 2)).await;
    assert_eq!(q.kind, EntityKind::Queue);
    // A quorum queue: RabbitMQ 3.10 gives no head_message_timestamp, and the admin does
    // not guess one.
    assert_eq!(q.oldest_enqueued_at, None);
    assert!(admin.describe().contains("management http://"), "{}", admin.describe());
    // Without credentials in the management URL, the AMQP URL's are used.
    if let Some(bare) = without_credentials(&management, &amqp_url().await) {
        let fallback = AmqpAdmin::new(&t).with_management(&bare).unwrap();
        assert_eq!((summary(&fallback, &queue).await.locked), 3);
    }
    // Two settled; the consumer then takes the next ones up to its prefetch (RabbitMQ
    // counts them unacknowledged too). Its connection closed, what it held goes back.
    for d in held.drain(..2) {
        d.complete().await.unwrap();
    }
    drop(held);
    drop(receiver);
    drop(admin);
    t.close().await;
    let other = transport(
        &VirtualClock::starting_now(),
        ScheduleStore::from(&memory_store().await),
    )
    .await;
    let admin = AmqpAdmin::new(&other)
        .with_queues([queue.clone()])
        .with_management(&management)
        .unwrap();
    until(&admin, &queue, "0 locked, 3 active", |q| (q.locked, q.active) == (0, 3)).await;
    other.delete(&EntityPath::queue(&queue)).await.unwrap();
    other.close().await;
}

#[tokio::test]
async fn rabbit_management_a_classic_queue_shows_its_head_message_timestamp_as_oldest() {
    // Not a Courier queue (those are quorum queues): another program's, named to the
    // admin. RabbitMQ gives its head message's AMQP timestamp.
    let queue = unique("rbmgmt-classic");
    let conn = Connection::connect(&amqp_url().await, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for at in [1_700_000_000_u64, 1_700_000_060] {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                b"{}",
                BasicProperties::default().with_timestamp(at),
            )
            .await
            .unwrap();
        assert!(confirm.await.unwrap().is_ack());
    }
    let clock = VirtualClock::starting_now();
    let store = memory_store().await;
    let t = transport(&clock, ScheduleStore::from(&store)).await;
    let admin = AmqpAdmin::new(&t)
        .with_queues([queue.clone()])
        .with_management(&management_url().await)
        .unwrap();
    let q = until(&admin, &queue, "the head message's timestamp", |q| {
        q.oldest_enqueued_at.is_some()
    })
    .await;
    assert_eq!(q.oldest_enqueued_at, chrono::DateTime::from_timestamp(1_700_000_000, 0));
    assert_eq!((q.active, q.locked), (2, 0));
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    conn.close(200, "done".into()).await.unwrap();
    t.close().await;
}

#[tokio::test]
async fn rabbit_management_unreachable_the_queues_have_their_amqp_counts_and_a_warning() {
    let queue = unique("rbmgmt-down");
    let t = queue_with(&queue, 4).await;
    let logs = Logs::default();
    let _guard = logs.capture();
    let url = format!("http://ops:hunter2@127.0.0.1:{}", closed_port());
    let admin = AmqpAdmin::new(&t).with_management(&url).unwrap();
    let q = until(&admin, &queue, "4 active", |q| q.active == 4).await;
    assert_eq!((q.locked, q.oldest_enqueued_at), (0, None));
    // One warning a listing, saying what to do, without the password.
    let before = logs.text().matches(WARNING).count();
    admin.queues().await.unwrap();
    let text = logs.text();
    assert_eq!(text.matches(WARNING).count(), before + 1, "{text}");
    assert!(text.contains("rabbitmq-plugins enable rabbitmq_management"), "{text}");
    assert!(text.contains("http://ops:***@127.0.0.1:"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!admin.describe().contains("hunter2"), "{}", admin.describe());
    t.delete(&EntityPath::queue(&queue)).await.unwrap();
    t.close().await;
}

#[tokio::test]
async fn rabbit_management_refused_credentials_leave_the_amqp_counts_and_a_warning() {
    let queue = unique("rbmgmt-creds");
    let t = queue_with(&queue, 2).await;
    let logs = Logs::default();
    let _guard = logs.capture();
    // The management API's host and port, with a user it does not know.
    let management = management_url().await;
    let host = management
        .split_once("://")
        .map(|(_, rest)| rest.rsplit_once('@').map_or(rest, |(_, h)| h))
        .unwrap();
    let url = format!("http://nobody-{}:wrong-secret@{host}", uuid::Uuid::new_v4().simple());
    let admin = AmqpAdmin::new(&t).with_management(&url).unwrap();
    let q = until(&admin, &queue, "2 active", |q| q.active == 2).await;
    assert_eq!((q.locked, q.oldest_enqueued_at), (0, None));
    let text = logs.text();
    assert!(text.contains(WARNING), "{text}");
    assert!(text.contains("check the credentials"), "{text}");
    assert!(text.contains("401"), "{text}");
    assert!(!text.contains("wrong-secret"), "{text}");
    t.delete(&EntityPath::queue(&queue)).await.unwrap();
    t.close().await;
}

#[tokio::test]
async fn rabbit_management_a_bad_url_is_refused_when_the_admin_is_built() {
    let clock = VirtualClock::starting_now();
    let store = memory_store().await;
    let t = transport(&clock, ScheduleStore::from(&store)).await;
    for (url, says) in [
        ("https://ops:hunter2@rabbit:15671", "HTTPS"),
        ("ops:hunter2@rabbit:15672", "not a URL"),
        ("http://ops:hunter2@rabbit:0", "port"),
        ("http://ops@rabbit:15672", "without a password"),
    ] {
        match AmqpAdmin::new(&t).with_management(url) {
            Err(e @ AdminError::Invalid { .. }) => {
                let text = e.to_string();
                assert!(text.contains(says), "{url}: {text}");
                assert!(!text.contains("hunter2"), "{url}: {text}");
                assert!(!e.is_transient());
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    t.close().await;
}
