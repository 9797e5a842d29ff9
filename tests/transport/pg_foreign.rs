//! A producer outside Courier on the Postgres transport: it inserts rows into
//! `courier.message` with SQL, as docs/postgres.md ("Messages from other producers")
//! describes. A row with an id is handled as any message; `message_id` is `NOT NULL` but
//! may be `''`, and such a message is dead-lettered with `courier.MissingMessageId` by an
//! endpoint with an inbox (either store), and handled at least once by one that opts in
//! or has no store, as on RabbitMQ (tests/amqp/foreign.rs).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::recoverability::reasons;
use courier::{
    Context, Endpoint, EndpointBuilder, EntityPath, HandlerError, PostgresStore, PostgresTransport, QueueOptions,
    RetryPolicy, Routes, Store, Transport,
};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgforeign.Job")]
struct Job {
    n: i64,
}

/// What each endpoint handled: (endpoint, n, the message id its handler saw).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, i64, String)>>>);

impl Seen {
    fn of(&self, endpoint: &str) -> Vec<(i64, String)> {
        let all = self.0.lock().unwrap();
        all.iter()
            .filter(|(e, _, _)| e == endpoint)
            .map(|(_, n, id)| (*n, id.clone()))
            .collect()
    }
}

#[courier::handler]
async fn note(job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
    let seen = ctx.state::<Seen>()?.clone();
    let row = (ctx.endpoint().to_owned(), job.n, ctx.message_id().to_owned());
    seen.0.lock().unwrap().push(row);
    Ok(())
}

/// The statement of docs/postgres.md: a message for queue `$1` with id `$2`, type `$3` and
/// a JSON body `$4`, receivable at once (the notification wakes waiting receivers).
const INSERT: &str = "WITH q AS (SELECT id FROM courier.entity WHERE parent = 0 AND kind = 0 AND name = $1), \
     m AS (INSERT INTO courier.message (entity_id, seq, state, enqueued_at, message_id, message_type, content_type, body) \
           SELECT q.id, nextval('courier.message_seq'), 0, now(), $2, $3, 'application/json', convert_to($4, 'UTF8') \
           FROM q RETURNING entity_id) \
     SELECT pg_notify('courier_transport', entity_id::text) FROM m";

/// Inserts a `pgforeign.Job` as a foreign producer does.
async fn insert(pool: &PgPool, queue: &str, message_id: &str, n: i64) {
    let done = sqlx::query(INSERT)
        .bind(queue)
        .bind(message_id)
        .bind("pgforeign.Job")
        .bind(format!(r#"{{"n":{n}}}"#))
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(done.rows_affected(), 1, "queue {queue} exists");
}

struct Env {
    db: TestDatabase,
    pool: PgPool,
    transport: Arc<PostgresTransport>,
    seen: Seen,
}

impl Env {
    async fn new(queues: &[&str]) -> Self {
        let db = TestDatabase::create().await;
        let pool = db.pool().await;
        let transport = Arc::new(
            PostgresTransport::from_pool(db.pool().await)
                .poll_interval(Duration::from_millis(200))
                .open()
                .await
                .unwrap(),
        );
        for q in queues {
            transport.create_queue(q, &QueueOptions::default()).await.unwrap();
        }
        Self {
            db,
            pool,
            transport,
            seen: Seen::default(),
        }
    }

    fn endpoint(&self, name: &str) -> EndpointBuilder {
        Endpoint::builder(name)
            .transport(self.transport.clone())
            .routes(Routes::new().send::<Job>(name))
            .state(self.seen.clone())
            .recoverability(RetryPolicy::none())
            .handler(note)
    }

    async fn dead_letters(&self, queue: &str) -> Vec<courier::ReceivedMessage> {
        self.transport
            .peek(&EntityPath::queue(queue).dead_letter(), 0, 10)
            .await
            .unwrap()
    }

    async fn finish(self) {
        self.transport.close().await;
        self.pool.close().await;
        self.db.drop_now().await;
    }
}

/// An endpoint with an inbox, on the transport's own store and on a `PostgresStore`:
/// a row with an id is handled (the documented format works), a row whose `message_id` is
/// `''` is dead-lettered at once with `courier.MissingMessageId` and a description saying
/// what to set, and nothing of it reaches the handler or the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_an_id_is_dead_lettered_by_an_endpoint_with_an_inbox() {
    let env = Env::new(&["in-tx", "in-outbox"]).await;
    let outbox_store = Arc::new(PostgresStore::from_pool(env.pool.clone()));
    outbox_store.migrate().await.unwrap();
    let in_tx = env
        .endpoint("in-tx")
        .store(env.transport.store())
        .start()
        .await
        .unwrap();
    let in_outbox = env.endpoint("in-outbox").store(outbox_store).start().await.unwrap();
    for (queue, running) in [("in-tx", &in_tx), ("in-outbox", &in_outbox)] {
        insert(&env.pool, queue, "job-1", 1).await;
        insert(&env.pool, queue, "", 2).await;
        eventually("the two outcomes", || async {
            running.stats().completed == 1 && running.stats().dead_lettered == 1
        })
        .await;
        assert_eq!(env.seen.of(queue), vec![(1, "job-1".to_owned())], "{queue}");
        let dead = env.dead_letters(queue).await;
        assert_eq!(dead.len(), 1, "{queue}");
        assert_eq!(dead[0].envelope.message_id, "", "{queue}: kept as it came");
        assert_eq!(
            dead[0].broker.dead_letter_reason.as_deref(),
            Some(reasons::MISSING_MESSAGE_ID),
            "{queue}"
        );
        let description = dead[0].broker.dead_letter_description.clone().unwrap_or_default();
        assert!(
            description.contains("message_id column of courier.message"),
            "{description}"
        );
        assert!(description.contains("accept_messages_without_id"), "{description}");
        assert_eq!(running.stats().retried, 0, "{queue}");
    }
    let inbox: Vec<(String, String)> =
        sqlx::query_as("SELECT endpoint, message_id FROM courier.inbox ORDER BY endpoint")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let expected = [("in-outbox", "job-1"), ("in-tx", "job-1")].map(|(e, m)| (e.to_owned(), m.to_owned()));
    assert_eq!(inbox, expected, "only the message with an id");
    in_tx.shutdown().await.unwrap();
    in_outbox.shutdown().await.unwrap();
    env.finish().await;
}

/// An endpoint with an inbox that opted in (`accept_messages_without_id(true)`), and one
/// without a store: each row without an id is handled, with a fresh id, at least once (two
/// such rows are two messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_an_id_is_handled_by_an_endpoint_that_opts_in_or_has_no_store() {
    let env = Env::new(&["opted-in", "no-store"]).await;
    let opted_in = env
        .endpoint("opted-in")
        .store(env.transport.store())
        .accept_messages_without_id(true)
        .start()
        .await
        .unwrap();
    let no_store = env.endpoint("no-store").start().await.unwrap();
    for (queue, running) in [("opted-in", &opted_in), ("no-store", &no_store)] {
        insert(&env.pool, queue, "", 1).await;
        insert(&env.pool, queue, "", 2).await;
        eventually("both handled", || async { running.stats().completed == 2 }).await;
        let mut seen = env.seen.of(queue);
        seen.sort();
        assert_eq!(seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1, 2], "{queue}");
        assert!(seen.iter().all(|(_, id)| !id.is_empty()), "{queue}: fresh ids {seen:?}");
        assert_ne!(seen[0].1, seen[1].1, "{queue}: one id each");
        assert_eq!(running.stats().dead_lettered, 0, "{queue}");
        assert!(env.dead_letters(queue).await.is_empty(), "{queue}");
    }
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.inbox WHERE endpoint = 'opted-in'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(recorded, 2, "under the fresh ids");
    opted_in.shutdown().await.unwrap();
    no_store.shutdown().await.unwrap();
    env.finish().await;
}
