//! The console over the other brokers' operations API: the Postgres transport
//! (`PostgresAdmin`, queues and store in one database) and RabbitMQ with a SQLite schedule
//! store (`AmqpAdmin` + `SqliteAdmin`). The pages and forms are the same code as over the
//! embedded broker (tested in the browser by the other modules); these tests drive them
//! over plain HTTP: the dashboard's counts, the dead-letter page, one dead letter, and a
//! resubmit posted with the page's CSRF token that puts the message back in its queue;
//! and on RabbitMQ with its management API, a message held unsettled shown as locked.

use std::sync::Arc;
use std::time::Duration;

use courier::admin::{AmqpAdmin, PostgresAdmin, QueueAdmin, SqliteAdmin, StoreAdmin};
use courier::{
    AmqpTransport, EntityPath, Envelope, PostgresTransport, QueueOptions, SenderOptions, SqliteStore, Store, Transport,
};
use courier_cli::console::Console;

use crate::fixture::{eventually, serve};
use crate::http::{csrf_of, http};

/// A name no earlier run used (the RabbitMQ tests share a broker's virtual host).
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// Sends one message to `queue` and dead-letters it, with a body an operator reads.
async fn one_dead_letter(transport: &dyn Transport, queue: &str, id: &str) {
    transport.create_queue(queue, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(queue, SenderOptions::default()).await.unwrap();
    let mut m = Envelope::new(r#"{"order":"A-17"}"#).with_message_id(id);
    m.message_type = Some("shop.PlaceOrder".into());
    sender.send(m).await.unwrap();
    let receiver = transport.receiver(&EntityPath::queue(queue)).await.unwrap();
    loop {
        if let Some(d) = receiver
            .receive(1, Duration::from_secs(5))
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            d.dead_letter("test.Poison", "the tax service said no").await.unwrap();
            return;
        }
    }
}

/// The dashboard lists `queue` with one dead letter; its DLQ page shows the message and
/// the reason; one dead letter in full shows the body; "Resubmit" (a POST with the CSRF
/// token of the page) redirects to the DLQ page saying one was resubmitted.
async fn resubmit_through_the_console(base: &str, queue: &str, id: &str) {
    let dashboard = http("GET", &format!("{base}/"), &[], None).await;
    assert_eq!(dashboard.status, 200, "{}", dashboard.body);
    assert!(
        dashboard.body.contains(&format!("data-queue=\"{queue}\"")),
        "{}",
        dashboard.body
    );

    let dlq = http("GET", &format!("{base}/dlq?queue={queue}"), &[], None).await;
    assert_eq!(dlq.status, 200, "{}", dlq.body);
    assert!(dlq.body.contains(id), "{}", dlq.body);
    assert!(dlq.body.contains("test.Poison"), "{}", dlq.body);
    let seq = dlq
        .body
        .split("name=\"one\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a Resubmit button with the message's sequence number")
        .to_owned();

    let one = http("GET", &format!("{base}/dlq/message?queue={queue}&seq={seq}"), &[], None).await;
    assert_eq!(one.status, 200, "{}", one.body);
    assert!(one.body.contains("A-17"), "the body is shown: {}", one.body);

    let csrf = csrf_of(&dlq.body);
    let form = format!("csrf={csrf}&queue={queue}&one={seq}");
    let done = http("POST", &format!("{base}/dlq/resubmit"), &[], Some(&form)).await;
    assert_eq!(done.status, 303, "{}", done.body);
    let to = done.headers["location"].to_str().unwrap().to_owned();
    assert!(to.contains("done=resubmitted") && to.contains("n=1"), "{to}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_postgres_transport_a_dead_letter_is_shown_and_resubmitted() {
    let db = courier::test_servers::postgres_database().await.unwrap();
    let transport = PostgresTransport::connect(&db.url()).await.unwrap();
    one_dead_letter(&transport, "console-orders", "pg-order-1").await;
    let admin = Arc::new(PostgresAdmin::connect(&db.url()).await.unwrap());
    let console = Console::new()
        .queues(admin.clone() as Arc<dyn QueueAdmin>)
        .store(admin.clone() as Arc<dyn StoreAdmin>);
    let base = serve(console).await;

    resubmit_through_the_console(&base, "console-orders", "pg-order-1").await;
    let counts = transport.counts(&EntityPath::queue("console-orders")).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (1, 0));
    let back = transport
        .receiver(&EntityPath::queue("console-orders"))
        .await
        .unwrap()
        .receive(1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(back[0].message().envelope.message_id, "pg-order-1");
    assert_eq!(
        back[0].message().broker.delivery_count,
        1,
        "its delivery count started again"
    );
    transport.close().await;
    db.drop_database().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_rabbitmq_with_a_sqlite_store_a_dead_letter_is_shown_and_resubmitted() {
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let amqp = vhost.url().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    let transport = AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let queue = unique("console-orders");
    one_dead_letter(&transport, &queue, "amqp-order-1").await;
    // Its receiver's consumer would take the resubmitted message: closed, and a transport
    // without a consumer counts afterwards.
    transport.close().await;
    let transport = AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let sqlite = SqliteAdmin::open(&file).await.unwrap();
    let schedules = courier::ScheduleStore::from(&sqlite);
    let queues = AmqpAdmin::connect(&amqp, Some(schedules)).await.unwrap();
    let console = Console::new()
        .queues(Arc::new(queues) as Arc<dyn QueueAdmin>)
        .store(Arc::new(sqlite) as Arc<dyn StoreAdmin>);
    let base = serve(console).await;

    resubmit_through_the_console(&base, &queue, "amqp-order-1").await;
    // RabbitMQ's counts follow the acknowledgement a moment later.
    eventually("the message back in its queue", || async {
        let c = transport.counts(&EntityPath::queue(&queue)).await.unwrap();
        (c.active, c.dead_lettered) == (1, 0)
    })
    .await;
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
    transport.close().await;
    vhost.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_rabbitmq_with_the_management_api_the_dashboard_shows_locked_messages() {
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let amqp = vhost.url().to_owned();
    let management = vhost.management_url().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    let transport = AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let queue = unique("console-held");
    transport.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(&queue, SenderOptions::default()).await.unwrap();
    for i in 0..3 {
        sender.send(Envelope::new(format!("{{\"n\":{i}}}"))).await.unwrap();
    }
    // One received and not settled.
    let receiver = transport.receiver(&EntityPath::queue(&queue)).await.unwrap();
    let held = loop {
        if let Some(d) = receiver.receive(1, Duration::from_secs(5)).await.unwrap().pop() {
            break d;
        }
    };
    let sqlite = SqliteAdmin::open(&file).await.unwrap();
    let schedules = courier::ScheduleStore::from(&sqlite);
    let queues = AmqpAdmin::connect(&amqp, Some(schedules))
        .await
        .unwrap()
        .with_management(&management)
        .unwrap();
    let console = Console::new()
        .queues(Arc::new(queues) as Arc<dyn QueueAdmin>)
        .store(Arc::new(sqlite) as Arc<dyn StoreAdmin>);
    let base = serve(console).await;

    // The row of the queue: active 2, locked 1 (the management API's statistics follow
    // a few seconds later), oldest unknown for a quorum queue.
    let row_of = |body: &str| {
        body.split(&format!("data-queue=\"{queue}\""))
            .nth(1)
            .and_then(|rest| rest.split("</tr>").next())
            .map(str::to_owned)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let row = loop {
        let page = http("GET", &format!("{base}/"), &[], None).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let row = row_of(&page.body).unwrap_or_default();
        if row.contains("class=\"n active\">2<") && row.contains("class=\"n locked\">1<") {
            break row;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dashboard shows no locked message: {row}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(row.contains(">-<"), "no oldest age: {row}");
    let page = http("GET", &format!("{base}/"), &[], None).await;
    assert!(page.body.contains("(management http://"), "{}", page.body);
    let password = management
        .split_once("://")
        .and_then(|(_, r)| r.rsplit_once('@'))
        .and_then(|(u, _)| u.split_once(':'))
        .map(|(_, p)| p.to_owned());
    if let Some(p) = password {
        assert!(!page.body.contains(&format!(":{p}@")), "{}", page.body);
    }
    held.complete().await.unwrap();
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
    transport.close().await;
    vhost.delete().await.unwrap();
}
