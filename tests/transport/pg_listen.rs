//! The Postgres transport's `LISTEN` connection is opened by its first receiver (or
//! session accept), not by `open`: a process that only sends reads no notifications
//! (each would be one more Postgres transaction per send). A receiver made later still
//! finds what was sent before it, and is woken by a notification rather than its poll.

use std::sync::Arc;
use std::time::Duration;

use courier::{Clock, EntityPath, Envelope, PostgresTransport, QueueOptions, SenderOptions, Transport, VirtualClock};
use courier_tests::pg_transport::database;
use sqlx::PgPool;
use uuid::Uuid;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}

/// A poll interval no receive of these tests may wait out: a receive that returns sooner
/// was woken by a notification or found its message at once.
const NEVER: Duration = Duration::from_secs(3600);

/// A transport whose connections carry the application name `app`, polling every
/// [`NEVER`].
async fn transport(clock: &VirtualClock, app: &str) -> PostgresTransport {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(database().await.application_name(app))
        .await
        .unwrap();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    PostgresTransport::from_pool(pool)
        .clock(shared)
        .migrate(false)
        .poll_interval(NEVER)
        .open()
        .await
        .unwrap()
}

/// The server's connections named `app` whose last statement was a `LISTEN`.
async fn listening(pool: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN%'")
        .bind(app)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_listens_only_once_it_has_a_receiver_and_its_receiver_is_woken() {
    let clock = VirtualClock::starting_now();
    let (app, other_app) = (unique("listen"), unique("sends"));
    let t = transport(&clock, &app).await;
    let other = transport(&clock, &other_app).await;
    let q = unique("q");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = other.sender(&q, SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("before")).await.unwrap();
    t.sender(&q, SenderOptions::default())
        .await
        .unwrap()
        .send(Envelope::new("own"))
        .await
        .unwrap();
    assert_eq!(
        listening(t.pool(), &app).await,
        0,
        "sending opened no LISTEN connection"
    );
    assert_eq!(listening(t.pool(), &other_app).await, 0);

    let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    assert_eq!(listening(t.pool(), &app).await, 1, "the receiver's transport listens");
    // Sent before the receiver existed: found by its first look, no notification needed.
    let got = tokio::time::timeout(Duration::from_secs(120), r.receive(5, NEVER))
        .await
        .expect("found at once, not after a poll")
        .unwrap();
    let bodies: Vec<&[u8]> = got.iter().map(|d| d.message().body().as_ref()).collect();
    assert_eq!(bodies, [b"before".as_slice(), b"own".as_slice()]);
    for d in got {
        d.complete().await.unwrap();
    }

    // A receive waiting (or about to) is woken by the other transport's send.
    let waiting = tokio::spawn({
        let r = r.clone();
        async move { r.receive(1, NEVER).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    sender.send(Envelope::new("after")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(120), waiting)
        .await
        .expect("woken by the notification, not by a poll")
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message().body().as_ref(), b"after");
    assert_eq!(listening(t.pool(), &app).await, 1, "one LISTEN connection");
    assert_eq!(
        listening(t.pool(), &other_app).await,
        0,
        "the sender's transport still none"
    );
    for d in got {
        d.complete().await.unwrap();
    }
    t.close().await;
    other.close().await;
}
