//! A saga on a session queue (issue 35, "Sagas"; docs/endpoints.md, "Sessions"): its
//! messages carry the instance's correlation value as session id, so one instance's
//! messages are handled one at a time by one endpoint instance at a time. Two endpoint
//! instances on two Postgres transports (two processes) share the queue's sessions and
//! one store; many messages per saga instance, sent at once: no optimistic-concurrency
//! conflict (`EndpointStats::saga_conflicts` of both is 0) and every instance's final
//! state holds every message, in send order. The same on RabbitMQ: two transports (two
//! connections, as two processes) and one Postgres store, the second started while the
//! first is active on the partitions, so that partitions move to it while the sagas run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::saga::SagaContext;
use courier::{
    Context, Endpoint, HandlerError, QueueOptions, RetryPolicy, Routes, RunningEndpoint, SendOptions, Transport,
    VirtualClock,
};
use courier_tests::eventually;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "saga.sessions.Deposit")]
struct Deposit {
    account: String,
    n: u32,
    last: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "saga.sessions.Closed")]
struct Closed {
    account: String,
    seen: Vec<u32>,
}

/// The saga's state: every deposit's number, in the order handled.
#[derive(Default, Serialize, Deserialize)]
struct Ledger {
    account: String,
    seen: Vec<u32>,
}

#[courier::saga(sends(Closed))]
impl Ledger {
    #[start(by = account)]
    async fn deposit(&mut self, m: Deposit, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.account = m.account;
        self.seen.push(m.n);
        // A moment in the middle, so that handlings of other instances overlap.
        tokio::time::sleep(Duration::from_millis(1)).await;
        if m.last {
            ctx.send(&Closed {
                account: self.account.clone(),
                seen: self.seen.clone(),
            })?;
            ctx.complete();
        }
        Ok(())
    }
}

const ACCOUNTS: u32 = 8;
const DEPOSITS: u32 = 25;

#[derive(Clone, Default)]
struct Finals(Arc<Mutex<Vec<Closed>>>);

/// Records each `Closed`.
struct Record(Finals);

impl courier::Handler for Record {
    type Message = Closed;
    fn name(&self) -> &'static str {
        "closed"
    }
    fn handle<'a>(&'a self, m: Closed, _ctx: &'a mut Context) -> courier::BoxFuture<'a, Result<(), HandlerError>> {
        self.0.0.lock().unwrap().push(m);
        Box::pin(async { Ok(()) })
    }
}

/// Each account's `Closed`, the accounts named by `name` in order, holds every deposit
/// once, in send order.
fn every_account_closed_in_order(recorded: &Finals, deposits: u32, name: impl Fn(usize) -> String) {
    let mut finals_seen = recorded.0.lock().unwrap().clone();
    finals_seen.sort_by(|x, y| x.account.cmp(&y.account));
    for (i, f) in finals_seen.iter().enumerate() {
        assert_eq!(f.account, name(i));
        assert_eq!(
            f.seen,
            (0..deposits).collect::<Vec<_>>(),
            "{}: every deposit once, in order",
            f.account
        );
    }
}

/// Waits until the two endpoints counted `n` messages completed between them. An
/// endpoint counts a message after its commit returns, and the last deposit's `Closed`,
/// committed with it, can be recorded by the other endpoint before that: reading the
/// counts as soon as every account closed saw one short under load.
async fn all_counted(a: &RunningEndpoint, b: &RunningEndpoint, n: u32) {
    eventually("every deposit counted", || async {
        a.stats().completed + b.stats().completed >= u64::from(n)
    })
    .await;
}

fn routes(queue: &str, finals: &str) -> Routes {
    Routes::new().send::<Deposit>(queue).send::<Closed>(finals)
}

async fn ledger_endpoint(transport: Arc<courier::PostgresTransport>, queue: &str, finals: &str) -> RunningEndpoint {
    ledger_on(transport.clone(), transport.store(), queue, finals).await
}

async fn ledger_on(
    transport: Arc<dyn Transport>,
    store: impl courier::Store,
    queue: &str,
    finals: &str,
) -> RunningEndpoint {
    Endpoint::builder(queue)
        .transport(transport)
        .store(store)
        .routes(routes(queue, finals))
        .queue_options(QueueOptions::default().requires_session(true))
        .recoverability(RetryPolicy::default().immediate(5).delayed([]))
        .concurrency(4)
        .receive_wait(Duration::from_millis(200))
        .saga::<Ledger>()
        .check_routes_at_start(false)
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_on_a_session_queue_has_no_conflicts_across_two_processes() {
    let clock = VirtualClock::starting_now();
    let one = Arc::new(courier_tests::pg_transport::transport(&clock).await);
    let two = Arc::new(courier_tests::pg_transport::transport(&clock).await);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (queue, finals) = (format!("ledger-{id}"), format!("closed-{id}"));
    let recorded = Finals::default();
    let r = recorded.clone();
    let closed = Endpoint::builder(finals.clone())
        .transport(one.clone())
        .routes(routes(&queue, &finals))
        .handler(Record(r))
        .start()
        .await
        .unwrap();
    let a = ledger_endpoint(one.clone(), &queue, &finals).await;
    let b = ledger_endpoint(two.clone(), &queue, &finals).await;
    // Every account's deposits in order, the accounts interleaved; each round at once.
    for n in 0..DEPOSITS {
        let mut sends = tokio::task::JoinSet::new();
        for account in 0..ACCOUNTS {
            let account = format!("account-{account}");
            let bus = if account.ends_with(['0', '2', '4', '6']) {
                a.bus()
            } else {
                b.bus()
            }
            .clone();
            let options = SendOptions::new().session_id(account.clone());
            let last = n + 1 == DEPOSITS;
            sends.spawn(async move { bus.send_with(&Deposit { account, n, last }, options).await.unwrap() });
        }
        while let Some(sent) = sends.join_next().await {
            sent.unwrap();
        }
    }
    eventually("every account closed", || async {
        recorded.0.lock().unwrap().len() == ACCOUNTS as usize
    })
    .await;
    every_account_closed_in_order(&recorded, DEPOSITS, |i| format!("account-{i}"));
    all_counted(&a, &b, ACCOUNTS * DEPOSITS).await;
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.saga_conflicts + sb.saga_conflicts, 0, "no conflict: {sa:?} {sb:?}");
    assert_eq!(sa.retried + sb.retried, 0, "{sa:?} {sb:?}");
    assert_eq!(
        sa.completed + sb.completed,
        u64::from(ACCOUNTS * DEPOSITS),
        "each deposit handled once"
    );
    assert!(
        sa.completed > 0 && sb.completed > 0,
        "both processes took sessions: {sa:?} {sb:?}"
    );
    for e in [a, b, closed] {
        e.shutdown().await.unwrap();
    }
    for q in [&queue, &finals] {
        one.delete(&courier::EntityPath::queue(q.as_str())).await.unwrap();
    }
}

/// RabbitMQ: 40 accounts of 20 deposits, a round every 300 ms; the second process starts
/// after the first round, while the first is the active consumer of the partitions, and
/// gets a share of them by the balance (docs/rabbitmq.md, "Sharing the partitions").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_a_saga_on_a_session_queue_has_no_conflicts_across_two_processes() {
    const ACCOUNTS: u32 = 40;
    // 20 rounds of 300 ms: the balance (every 2 s) hands partitions over well before the end.
    const DEPOSITS: u32 = 20;
    let db = courier_tests::pg::TestDatabase::create().await;
    let store = courier::PostgresStore::from_pool(db.pool().await);
    courier::Store::migrate(&store).await.unwrap();
    let url = courier_tests::rabbit::amqp_url().await;
    let open = || async {
        let t: Arc<dyn Transport> = Arc::new(
            courier::AmqpTransport::builder(url.clone())
                .schedules(&store)
                .open()
                .await
                .unwrap(),
        );
        t
    };
    let (one, two) = (open().await, open().await);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (queue, finals) = (format!("ledger-{id}"), format!("closed-{id}"));
    let recorded = Finals::default();
    let closed = Endpoint::builder(finals.clone())
        .transport(one.clone())
        .routes(routes(&queue, &finals))
        .handler(Record(recorded.clone()))
        .start()
        .await
        .unwrap();
    let a = ledger_on(one.clone(), store.clone(), &queue, &finals).await;
    let mut b = None;
    for n in 0..DEPOSITS {
        for account in 0..ACCOUNTS {
            let account = format!("account-{account:02}");
            let options = SendOptions::new().session_id(account.clone());
            let last = n + 1 == DEPOSITS;
            a.bus().send_with(&Deposit { account, n, last }, options).await.unwrap();
        }
        if n == 0 {
            b = Some(ledger_on(two.clone(), store.clone(), &queue, &finals).await);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let b = b.unwrap();
    eventually("every account closed", || async {
        recorded.0.lock().unwrap().len() == ACCOUNTS as usize
    })
    .await;
    every_account_closed_in_order(&recorded, DEPOSITS, |i| format!("account-{i:02}"));
    all_counted(&a, &b, ACCOUNTS * DEPOSITS).await;
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.saga_conflicts + sb.saga_conflicts, 0, "no conflict: {sa:?} {sb:?}");
    assert_eq!(
        sa.completed + sb.completed,
        u64::from(ACCOUNTS * DEPOSITS),
        "each deposit handled once"
    );
    assert!(sb.completed > 0, "the second process took partitions: {sa:?} {sb:?}");
    for e in [a, b, closed] {
        e.shutdown().await.unwrap();
    }
    for q in [&queue, &finals] {
        one.delete(&courier::EntityPath::queue(q.as_str())).await.unwrap();
    }
    one.close().await;
    two.close().await;
}
