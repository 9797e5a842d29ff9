//! `courier::testing`: the harness users test their sagas with. A saga written with
//! `#[courier::saga]`, as a user writes it; virtual time moved by `advance`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::recoverability::reasons as failure_reasons;
use courier::saga::{SagaContext, TimeoutHandle};
use courier::testing::{TestEndpoint, TimeoutStatus};
use courier::{Context, HandlerError, RetryPolicy, Routes, SendOptions};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Registered")]
struct Registered {
    user: String,
    /// Ask for a reminder every ten minutes, this many times, before expiring.
    reminders: u32,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Confirmed")]
struct Confirmed {
    user: String,
}

/// Two expiries due at the same instant; the first to fire completes the saga.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Hurry")]
struct Hurry {
    user: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Expired")]
struct Expired;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Remind")]
struct Remind;

#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.SendMail")]
struct SendMail {
    user: String,
    reminder: u32,
}

#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.UserActivated")]
struct UserActivated {
    user: String,
}

#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.UserRemoved")]
struct UserRemoved {
    user: String,
}

/// When each reminder fired, by the handler's clock.
#[derive(Default)]
struct FiredAt(Mutex<Vec<chrono::DateTime<chrono::Utc>>>);

#[derive(Debug, Default, Serialize, Deserialize)]
struct SignUp {
    user: String,
    reminders_left: u32,
    sent: u32,
    expiry: Option<TimeoutHandle>,
    reminder: Option<TimeoutHandle>,
}

#[courier::saga(name = "harness.SignUp")]
impl SignUp {
    #[start(by = user)]
    async fn registered(&mut self, msg: Registered, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.user = msg.user;
        self.reminders_left = msg.reminders;
        self.expiry = Some(ctx.request_timeout(Duration::from_secs(3600), &Expired)?);
        if self.reminders_left > 0 {
            self.reminder = Some(ctx.request_timeout(Duration::from_secs(600), &Remind)?);
        }
        Ok(())
    }

    #[handle(by = user)]
    async fn confirmed(&mut self, _msg: Confirmed, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if let Some(expiry) = self.expiry.take() {
            ctx.cancel_timeout_handle(&expiry);
        }
        ctx.publish(&UserActivated {
            user: self.user.clone(),
        })?;
        ctx.complete();
        Ok(())
    }

    #[handle(by = user)]
    async fn hurry(&mut self, _msg: Hurry, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        let at = ctx.clock().now() + chrono::Duration::seconds(60);
        // Two of one type: each under a key of its own (one key would replace).
        ctx.request_timeout_keyed_at("hurry-1", at, &Expired)?;
        ctx.request_timeout_keyed_at("hurry-2", at, &Expired)?;
        Ok(())
    }

    #[timeout]
    async fn remind(&mut self, _t: Remind, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.state::<Arc<FiredAt>>()?
            .0
            .lock()
            .map_err(|_| HandlerError::msg("poisoned"))?
            .push(ctx.clock().now());
        self.sent += 1;
        self.reminders_left -= 1;
        ctx.send(&SendMail {
            user: self.user.clone(),
            reminder: self.sent,
        })?;
        if self.reminders_left > 0 {
            self.reminder = Some(ctx.request_timeout(Duration::from_secs(600), &Remind)?);
        }
        Ok(())
    }

    #[timeout]
    async fn expired(&mut self, _t: Expired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.send(&UserRemoved {
            user: self.user.clone(),
        })?;
        ctx.complete();
        Ok(())
    }
}

/// A command whose handler always fails: it goes through the retries in virtual time.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Flaky")]
struct Flaky;

#[courier::handler]
async fn always_fails(_msg: Flaky) -> Result<(), HandlerError> {
    Err(HandlerError::msg("the gateway is down"))
}

async fn sign_up() -> TestEndpoint {
    let routes = Routes::new()
        .send::<SendMail>("mailer")
        .send::<UserRemoved>("users")
        .event::<UserActivated>();
    TestEndpoint::start("accounts", |e| {
        e.routes(routes)
            .saga::<SignUp>()
            .handler(always_fails)
            .state(Arc::new(FiredAt::default()))
    })
    .await
    .unwrap()
}

fn registered(user: &str, reminders: u32) -> Registered {
    Registered {
        user: user.into(),
        reminders,
    }
}

#[tokio::test]
async fn confirmation_in_time_cancels_the_expiry() {
    let t = sign_up().await;
    t.send(&registered("ann", 0)).await.unwrap();
    let state = t.saga::<SignUp>("ann").await.unwrap().expect("an instance");
    assert_eq!(state.user, "ann");
    assert_eq!(t.pending_timeouts().await.unwrap().len(), 1);
    t.advance(Duration::from_secs(59 * 60)).await.unwrap();
    t.send(&Confirmed { user: "ann".into() }).await.unwrap();
    assert_eq!(
        t.published::<UserActivated>().await.unwrap(),
        vec![UserActivated { user: "ann".into() }]
    );
    assert_eq!(t.timeouts().await.unwrap()[0].status, TimeoutStatus::Cancelled);
    t.advance(Duration::from_secs(7200)).await.unwrap();
    assert!(
        t.sent::<UserRemoved>().await.unwrap().is_empty(),
        "the expiry never fired"
    );
    assert!(t.saga::<SignUp>("ann").await.unwrap().is_none(), "completed");
    assert_eq!(t.stats().timeouts_discarded, 0, "cancelled rows are never even sent");
    t.shutdown().await.unwrap();
}

#[tokio::test]
async fn no_confirmation_fires_the_expiry_once_at_its_time() {
    let t = sign_up().await;
    let start = t.now();
    t.send(&registered("bob", 0)).await.unwrap();
    t.advance(Duration::from_secs(3599)).await.unwrap();
    assert!(t.sent::<UserRemoved>().await.unwrap().is_empty(), "not before its time");
    t.advance(Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        t.sent::<UserRemoved>().await.unwrap(),
        vec![UserRemoved { user: "bob".into() }]
    );
    let timeouts = t.timeouts().await.unwrap();
    let expiry = &timeouts[0];
    assert_eq!(expiry.status, TimeoutStatus::Fired);
    assert_eq!(expiry.due, start + chrono::Duration::seconds(3600));
    assert_eq!(expiry.message_type(), Some("harness.Expired"));
    t.advance(Duration::from_secs(24 * 3600)).await.unwrap();
    assert_eq!(t.sent::<UserRemoved>().await.unwrap().len(), 1, "once");
    t.shutdown().await.unwrap();
}

/// One long advance stops at every due time on the way: timeouts requested by timeouts
/// fire at their own times, and the expiry after them.
#[tokio::test]
async fn one_advance_fires_each_timeout_at_its_own_time() {
    let t = sign_up().await;
    let start = t.now();
    t.send(&registered("cid", 3)).await.unwrap();
    t.advance(Duration::from_secs(2 * 3600)).await.unwrap();
    let mails = t.sent::<SendMail>().await.unwrap();
    assert_eq!(mails.iter().map(|m| m.reminder).collect::<Vec<_>>(), vec![1, 2, 3]);
    let expected: Vec<_> = [600, 1200, 1800]
        .iter()
        .map(|s| start + chrono::Duration::seconds(*s))
        .collect();
    let due = {
        let probe = t.timeouts().await.unwrap();
        let fired: Vec<_> = probe
            .iter()
            .filter(|x| x.message_type() == Some("harness.Remind"))
            .map(|x| (x.status, x.due))
            .collect();
        assert_eq!(fired.len(), 3);
        assert!(fired.iter().all(|(s, _)| *s == TimeoutStatus::Fired));
        fired.into_iter().map(|(_, due)| due).collect::<Vec<_>>()
    };
    assert_eq!(due, expected);
    assert_eq!(t.sent::<UserRemoved>().await.unwrap().len(), 1, "then the expiry");
    assert_eq!(t.now(), start + chrono::Duration::seconds(7200));
    t.shutdown().await.unwrap();
}

/// The handler's own clock reads each reminder's due time when it runs.
#[tokio::test]
async fn handlers_run_at_the_due_time() {
    let fired = Arc::new(FiredAt::default());
    let routes = Routes::new()
        .send::<SendMail>("mailer")
        .send::<UserRemoved>("users")
        .event::<UserActivated>();
    let probe = fired.clone();
    let t = TestEndpoint::start("accounts", move |e| e.routes(routes).saga::<SignUp>().state(probe))
        .await
        .unwrap();
    let start = t.now();
    t.send(&registered("dan", 2)).await.unwrap();
    t.advance(Duration::from_secs(3600)).await.unwrap();
    let at = fired.0.lock().unwrap().clone();
    assert_eq!(
        at,
        vec![
            start + chrono::Duration::seconds(600),
            start + chrono::Duration::seconds(1200)
        ]
    );
    t.shutdown().await.unwrap();
}

/// Two timeouts due together: the first completes the saga, the second is discarded.
#[tokio::test]
async fn a_timeout_after_completion_is_discarded() {
    let t = sign_up().await;
    t.send(&registered("eve", 0)).await.unwrap();
    t.send(&Hurry { user: "eve".into() }).await.unwrap();
    assert_eq!(t.pending_timeouts().await.unwrap().len(), 3);
    t.advance(Duration::from_secs(60)).await.unwrap();
    assert_eq!(t.sent::<UserRemoved>().await.unwrap().len(), 1, "removed once");
    let statuses: Vec<_> = t
        .timeouts()
        .await
        .unwrap()
        .iter()
        .map(|x| (x.status, x.discarded))
        .collect();
    // The hour-long expiry was cancelled by the completion; of the two hurried ones, one
    // fired and the other was cancelled with the completion and, already sent, discarded.
    assert_eq!(statuses[0], (TimeoutStatus::Cancelled, false));
    let mut hurried = statuses[1..].to_vec();
    hurried.sort_by_key(|(s, _)| *s == TimeoutStatus::Cancelled);
    assert_eq!(
        hurried,
        vec![(TimeoutStatus::Fired, false), (TimeoutStatus::Cancelled, true)]
    );
    assert_eq!(t.stats().timeouts_discarded, 1);
    t.shutdown().await.unwrap();
}

/// A failing handler is retried at once, then after 10, 20 and 30 s of virtual time,
/// then dead-lettered: `advance` walks through the delayed retries.
#[tokio::test]
async fn retries_run_in_virtual_time_and_end_in_the_dead_letter_queue() {
    let t = sign_up().await;
    t.send(&Flaky).await.unwrap();
    assert!(t.dead_lettered().await.unwrap().is_empty(), "delayed retries pending");
    t.advance(Duration::from_secs(60)).await.unwrap();
    let dead = t.dead_lettered().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason.as_deref(), Some(failure_reasons::RETRIES_EXHAUSTED));
    assert!(
        dead[0]
            .description
            .as_deref()
            .unwrap_or("")
            .contains("the gateway is down"),
        "{:?}",
        dead[0].description
    );
    assert_eq!(dead[0].envelope.message_type.as_deref(), Some("harness.Flaky"));
    assert_eq!(t.handled().await.unwrap(), 0, "a failed handling records nothing");
    t.shutdown().await.unwrap();
}

/// Messages sent with a header correlate; sent messages name what sent them.
#[tokio::test]
async fn sent_messages_say_where_they_went() {
    let t = sign_up().await;
    t.send_with(&registered("fay", 1), SendOptions::new().header("x-test", "1"))
        .await
        .unwrap();
    t.advance(Duration::from_secs(600)).await.unwrap();
    let all = t.messages().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].destination, "mailer");
    assert!(!all[0].is_topic);
    assert_eq!(all[0].sent_by.as_deref(), Some("harness.Remind"));
    assert_eq!(
        all[0].decode::<SendMail>().unwrap(),
        SendMail {
            user: "fay".into(),
            reminder: 1
        }
    );
    t.shutdown().await.unwrap();
}

/// Regression (issue 13, bug 2), the docs' own pattern: the start handler keeps
/// `self.expiry = Some(ctx.request_timeout(..))`. A client retries the registration with
/// a new message id; the second handle overwrites the first in the state, and the
/// confirmation cancels only the second. The first timeout used to stay pending and fire
/// an hour later, removing a user who had confirmed. Now the second request replaces it.
#[tokio::test]
async fn a_start_that_arrives_twice_leaves_no_orphaned_timeout() {
    let t = sign_up().await;
    t.send(&registered("gil", 0)).await.unwrap();
    t.send(&registered("gil", 0)).await.unwrap();
    let statuses: Vec<_> = t.timeouts().await.unwrap().iter().map(|x| x.status).collect();
    assert_eq!(statuses, vec![TimeoutStatus::Replaced, TimeoutStatus::Pending]);
    assert_eq!(t.pending_timeouts().await.unwrap().len(), 1);
    t.send(&Confirmed { user: "gil".into() }).await.unwrap();
    t.advance(Duration::from_secs(2 * 3600)).await.unwrap();
    assert!(
        t.sent::<UserRemoved>().await.unwrap().is_empty(),
        "no orphaned timeout removed a confirmed user"
    );
    assert_eq!(t.stats().timeouts_discarded, 0, "the replaced timeout was never sent");
    t.shutdown().await.unwrap();
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.PlaceOrder")]
struct PlaceOrder {
    id: String,
    total_cents: i64,
}

/// Writes the order into the application's own table (created by its migration), in the
/// message's transaction; refuses a negative total after writing.
#[courier::handler]
async fn place_order(order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    let tx = ctx.transaction::<sqlx::Sqlite>()?;
    sqlx::query("INSERT INTO orders (id, total_cents) VALUES (?1, ?2)")
        .bind(&order.id)
        .bind(order.total_cents)
        .execute(&mut *tx)
        .await?;
    if order.total_cents < 0 {
        return Err(HandlerError::msg("a negative total"));
    }
    Ok(())
}

async fn order_count(t: &TestEndpoint, id: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE id = ?1")
        .bind(id)
        .fetch_one(t.read_pool())
        .await
        .unwrap()
}

/// Issue 13, point 10: the application's migrations are applied to the harness's broker
/// and its tables are read through `read_pool`, as the handlers left them; a failed
/// handling left no row; the pool does not write.
#[tokio::test]
async fn reads_the_applications_own_tables() {
    let t = TestEndpoint::builder("orders")
        .migrations(sqlx::migrate!("../examples/migrations"))
        .start(|e| e.handler(place_order).recoverability(RetryPolicy::none()))
        .await
        .unwrap();
    t.send(&PlaceOrder {
        id: "o-1".into(),
        total_cents: 1250,
    })
    .await
    .unwrap();
    let total: i64 = sqlx::query_scalar("SELECT total_cents FROM orders WHERE id = ?1")
        .bind("o-1")
        .fetch_one(t.read_pool())
        .await
        .unwrap();
    assert_eq!(total, 1250);

    t.send(&PlaceOrder {
        id: "o-2".into(),
        total_cents: -1,
    })
    .await
    .unwrap();
    assert_eq!(t.dead_lettered().await.unwrap().len(), 1, "the failed order");
    assert_eq!(order_count(&t, "o-2").await, 0, "its row was rolled back");
    assert_eq!(t.handled().await.unwrap(), 1);

    let refused = sqlx::query("DELETE FROM orders").execute(t.read_pool()).await;
    let error = refused.expect_err("the read pool does not write").to_string();
    assert!(error.contains("readonly"), "{error}");
    assert_eq!(order_count(&t, "o-1").await, 1);
    t.shutdown().await.unwrap();
}

#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Announce")]
struct Announce {
    n: u32,
}

#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Announced")]
struct Announced {
    n: u32,
}

#[courier::handler]
async fn announce(m: Announce, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.publish(&Announced { n: m.n })?;
    Ok(())
}

/// The harness behaves as the transports do (issue 30, bug 6): it does not create the
/// topics of the routed events up front (that hid a store that could not publish to a
/// topic nobody created yet); a handler's publish creates the topic, in its handling's
/// transaction, and the handling completes. The queues of the routed commands are still
/// created (handlers may send to endpoints that are not running).
#[tokio::test]
async fn a_published_events_topic_is_not_created_up_front_and_the_publish_creates_it() {
    use courier::{SenderOptions, Transport};
    let routes = Routes::new()
        .send::<Announce>("announcer")
        .send::<SendMail>("mailer")
        .event::<Announced>();
    let t = TestEndpoint::start("announcer", |e| {
        e.routes(routes).handler(announce).recoverability(RetryPolicy::none())
    })
    .await
    .unwrap();
    let exists = |name: &'static str| {
        let broker = t.broker().clone();
        async move {
            match broker.sender(name, SenderOptions::default()).await {
                Ok(_) => true,
                Err(e) if matches!(e.kind(), courier::ErrorKind::EntityNotFound { .. }) => false,
                Err(e) => panic!("cannot look up {name}: {e}"),
            }
        }
    };
    assert!(
        !exists("harness.Announced").await,
        "the topic of an event the endpoint only publishes is not created up front"
    );
    assert!(exists("mailer").await, "the queue of a routed command is created");

    t.send(&Announce { n: 1 }).await.unwrap();
    assert_eq!(t.handled().await.unwrap(), 1, "handled, once");
    assert!(t.dead_lettered().await.unwrap().is_empty());
    assert_eq!(t.published::<Announced>().await.unwrap(), vec![Announced { n: 1 }]);
    assert!(exists("harness.Announced").await, "the publish created the topic");

    t.send(&Announce { n: 2 }).await.unwrap();
    assert_eq!(t.handled().await.unwrap(), 2);
    assert!(t.dead_lettered().await.unwrap().is_empty());
    t.shutdown().await.unwrap();
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Open")]
struct Open {
    id: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "harness.Deadline")]
struct Deadline;

/// A saga whose timeout handler fails for good.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Doomed;

#[courier::saga(name = "harness.Doomed")]
impl Doomed {
    #[start(by = id)]
    async fn open(&mut self, _msg: Open, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.request_timeout(Duration::from_secs(60), &Deadline)?;
        Ok(())
    }

    #[timeout]
    async fn deadline(&mut self, _t: Deadline, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        Err(HandlerError::permanent("the deadline cannot be handled"))
    }
}

/// Regression (issue 34, part 4): a timeout whose handler fails for good is
/// dead-lettered and never sent again, yet `timeouts()` showed it `Pending` and
/// `pending_timeouts()` counted it. It is `DeadLettered`, with its reason, and not pending.
#[tokio::test]
async fn a_dead_lettered_timeout_is_not_pending() {
    let t = TestEndpoint::start("doomed", |e| e.saga::<Doomed>()).await.unwrap();
    t.send(&Open { id: "d-1".into() }).await.unwrap();
    assert_eq!(t.pending_timeouts().await.unwrap().len(), 1);
    t.advance(Duration::from_secs(61)).await.unwrap();
    assert_eq!(t.stats().timeouts_dead_lettered, 1);
    let timeouts = t.timeouts().await.unwrap();
    assert_eq!(timeouts.len(), 1);
    assert_eq!(timeouts[0].status, TimeoutStatus::DeadLettered);
    assert_eq!(
        timeouts[0].dead_letter_reason.as_deref(),
        Some(failure_reasons::PERMANENT_FAILURE)
    );
    assert!(t.pending_timeouts().await.unwrap().is_empty());
    t.shutdown().await.unwrap();
}
