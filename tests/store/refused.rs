//! Outgoing messages the transport can never accept, on every store: refused when the
//! handler sends (the handled message is dead-lettered with a reason naming the outgoing
//! one, nothing committed), and, for what only the send can see, outbox rows moved to the
//! outbox dead letters instead of being retried forever.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::recoverability::{headers, reasons};
use courier::{
    Clock, Context, Endpoint, EntityPath, HandlerError, PropertyValue, QueueOptions, RetryPolicy, Routes,
    RunningEndpoint, SendOptions,
};
use courier_tests::eventually;
use courier_tests::stores::{StoreEnv, StoreKind as Kind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "refused.SignUp")]
struct SignUp {
    email_len: usize,
    to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "refused.ConfirmationMail")]
struct ConfirmationMail {
    email: String,
}

#[derive(Clone, Default)]
struct Calls(Arc<AtomicU32>);

#[courier::handler]
async fn sign_up(msg: SignUp, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.state::<Calls>()?.0.fetch_add(1, Ordering::SeqCst);
    let mail = ConfirmationMail {
        email: "x".repeat(msg.email_len),
    };
    ctx.send_with(&mail, SendOptions::new().to(msg.to))?;
    Ok(())
}

/// Sends a mail to `to`, with the message id `id` when one is given.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "refused.Relay")]
struct Relay {
    to: String,
    id: Option<String>,
}

#[courier::handler]
async fn relay(msg: Relay, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.state::<Calls>()?.0.fetch_add(1, Ordering::SeqCst);
    let mut options = SendOptions::new().to(msg.to);
    if let Some(id) = msg.id {
        options = options.message_id(id);
    }
    ctx.send_with(&ConfirmationMail { email: "a@b".into() }, options)?;
    Ok(())
}

/// A too-large mail goes here (it exists: only the size is wrong).
const MAIL: &str = "mail";
/// A queue that needs session ids, which the mails lack: only the send can tell.
const SESSIONS: &str = "mail-sessions";

async fn start(env: &StoreEnv, calls: &Calls) -> RunningEndpoint {
    for (queue, sessions) in [(MAIL, false), (SESSIONS, true)] {
        env.fx
            .transport
            .create_queue(queue, &QueueOptions::default().requires_session(sessions))
            .await
            .unwrap();
    }
    let clock: Arc<dyn Clock> = Arc::new(env.fx.clock.clone());
    Endpoint::builder("signup")
        .transport(env.fx.transport.clone())
        .clock(clock)
        .routes(Routes::new().send::<SignUp>("signup").send::<Relay>("signup"))
        .store(env.store.clone())
        .state(calls.clone())
        // Without the fix a refusal was retried: no retries keeps the old run short.
        .recoverability(RetryPolicy::default().immediate(0).delayed([]))
        .handler(sign_up)
        .handler(relay)
        .start()
        .await
        .unwrap()
}

fn table(env: &StoreEnv, name: &str) -> String {
    format!("SELECT COUNT(*) FROM {}", env.kind.table(name))
}

async fn dead_letters(env: &StoreEnv) -> Vec<courier::ReceivedMessage> {
    env.fx
        .transport
        .peek(&EntityPath::queue("signup").dead_letter(), 0, 10)
        .await
        .unwrap()
}

/// The case: a 1.2 MB confirmation mail, over the broker's 1 MiB limit. The send
/// in the handler fails at once; the handler returns that error with `?`, so the
/// sign-up is dead-lettered (no retry) with `courier.InvalidOutgoingMessage` and a
/// description naming the mail; nothing is committed, nothing waits in the outbox.
pub(crate) async fn a_message_too_large_to_send_dead_letters_the_handled_message(kind: Kind) {
    let env = StoreEnv::new(kind).await;
    let calls = Calls::default();
    let signup = start(&env, &calls).await;
    let msg = SignUp {
        email_len: 1_200_000,
        to: MAIL.into(),
    };
    signup.bus().send(&msg).await.unwrap();
    eventually("the dead letter", || async { signup.stats().dead_lettered == 1 }).await;
    let dead = dead_letters(&env).await;
    assert_eq!(dead.len(), 1);
    let broker = &dead[0].broker;
    assert_eq!(
        broker.dead_letter_reason.as_deref(),
        Some(reasons::INVALID_OUTGOING_MESSAGE)
    );
    let description = broker.dead_letter_description.as_deref().unwrap_or("");
    assert!(description.contains("refused.ConfirmationMail"), "{description}");
    assert!(description.contains("queue mail"), "{description}");
    assert!(description.contains("exceeds the limit"), "{description}");
    assert_eq!(
        dead[0].envelope.properties.get(headers::FAILURE_PERMANENT),
        Some(&PropertyValue::Bool(true))
    );
    assert_eq!(signup.stats().retried, 0, "no retry can help");
    assert_eq!(calls.0.load(Ordering::SeqCst), 1);
    assert_eq!(env.count(&table(&env, "inbox")).await, 0, "nothing committed");
    assert_eq!(env.count(&table(&env, "outbox")).await, 0, "nothing left to dispatch");
    assert!(env.queued_ids(MAIL).await.is_empty());
    signup.shutdown().await.unwrap();
    env.finish().await;
}

/// What no transport accepts whatever the destination: a destination name that is not
/// one (a space in it) and a message id over 128 bytes. Each is refused when the handler
/// sends, so the handled message is dead-lettered at once with
/// `courier.InvalidOutgoingMessage` and a description naming the mail and what is wrong;
/// nothing is committed, nothing waits in the outbox.
pub(crate) async fn an_invalid_destination_or_id_dead_letters_the_handled_message(kind: Kind) {
    let env = StoreEnv::new(kind).await;
    let calls = Calls::default();
    let signup = start(&env, &calls).await;
    let bad_name = Relay {
        to: "mail box".into(),
        id: None,
    };
    signup.bus().send(&bad_name).await.unwrap();
    eventually("the first dead letter", || async { signup.stats().dead_lettered == 1 }).await;
    let long_id = Relay {
        to: MAIL.into(),
        id: Some("i".repeat(200)),
    };
    signup.bus().send(&long_id).await.unwrap();
    eventually("the second dead letter", || async { signup.stats().dead_lettered == 2 }).await;
    let dead = dead_letters(&env).await;
    assert_eq!(dead.len(), 2);
    let mut descriptions = Vec::new();
    for d in &dead {
        assert_eq!(
            d.broker.dead_letter_reason.as_deref(),
            Some(reasons::INVALID_OUTGOING_MESSAGE)
        );
        assert_eq!(
            d.envelope.properties.get(headers::FAILURE_PERMANENT),
            Some(&PropertyValue::Bool(true))
        );
        let description = d.broker.dead_letter_description.clone().unwrap_or_default();
        assert!(description.contains("refused.ConfirmationMail"), "{description}");
        descriptions.push(description);
    }
    assert!(
        descriptions
            .iter()
            .any(|d| d.contains("invalid entity name \"mail box\"")),
        "{descriptions:?}"
    );
    assert!(
        descriptions
            .iter()
            .any(|d| d.contains("to queue mail") && d.contains("1 to 128 bytes, it has 200")),
        "{descriptions:?}"
    );
    assert_eq!(signup.stats().retried, 0, "no retry can help");
    assert_eq!(calls.0.load(Ordering::SeqCst), 2);
    assert_eq!(env.count(&table(&env, "inbox")).await, 0, "nothing committed");
    assert_eq!(env.count(&table(&env, "outbox")).await, 0, "nothing left to dispatch");
    assert!(env.queued_ids(MAIL).await.is_empty());
    signup.shutdown().await.unwrap();
    env.finish().await;
}

/// A mail to a queue that requires sessions passes the checks made when the handler
/// sends (they do not know the destination) and is refused by the send. With an outbox
/// the handling is committed, the row is moved to the outbox dead letters with
/// `courier.DispatchRefused` and counted, the sign-up completed, and nothing is retried
/// later. In one transaction with the broker the commit is refused: the sign-up is
/// dead-lettered with `courier.InvalidOutgoingMessage`, nothing committed.
pub(crate) async fn a_message_refused_at_dispatch_is_never_retried_forever(kind: Kind) {
    let env = StoreEnv::new(kind).await;
    let calls = Calls::default();
    let signup = start(&env, &calls).await;
    let msg = SignUp {
        email_len: 10,
        to: SESSIONS.into(),
    };
    signup.bus().send(&msg).await.unwrap();
    if kind.one_transaction() {
        eventually("the dead letter", || async { signup.stats().dead_lettered == 1 }).await;
        let dead = dead_letters(&env).await;
        assert_eq!(
            dead[0].broker.dead_letter_reason.as_deref(),
            Some(reasons::INVALID_OUTGOING_MESSAGE)
        );
        let description = dead[0].broker.dead_letter_description.as_deref().unwrap_or("");
        assert!(description.contains("refused.ConfirmationMail"), "{description}");
        assert!(description.contains("queue mail-sessions"), "{description}");
        assert!(description.contains("requires sessions"), "{description}");
        assert_eq!(env.count(&table(&env, "inbox")).await, 0, "nothing committed");
    } else {
        eventually("the row moved aside", || async {
            signup.stats().outbox_dead_lettered == 1
        })
        .await;
        eventually("completion", || async { signup.stats().completed == 1 }).await;
        let aside = env.store.dead_lettered_outbox("signup", 10).await.unwrap();
        assert_eq!(aside.len(), 1);
        assert_eq!(aside[0].reason, reasons::DISPATCH_REFUSED);
        assert_eq!(aside[0].message.destination, SESSIONS);
        assert!(
            aside[0].description.contains("refused.ConfirmationMail"),
            "{}",
            aside[0].description
        );
        assert!(
            aside[0].description.contains("requires sessions"),
            "{}",
            aside[0].description
        );
        assert_eq!(env.count(&table(&env, "inbox")).await, 1, "the handling committed");
        assert_eq!(env.count(&table(&env, "outbox")).await, 0);
        assert!(dead_letters(&env).await.is_empty(), "the sign-up itself succeeded");
        // The sweeper finds nothing to retry.
        env.fx.clock.advance(Duration::from_secs(40));
        env.fx.clock.advance(Duration::from_secs(40));
        assert_eq!(signup.stats().outbox_dead_lettered, 1);
        assert_eq!(env.store.dead_lettered_outbox("signup", 10).await.unwrap().len(), 1);
    }
    assert_eq!(calls.0.load(Ordering::SeqCst), 1);
    assert_eq!(signup.stats().retried, 0);
    signup.shutdown().await.unwrap();
    env.finish().await;
}

/// Rows left behind (a process died after its commit): one that can never be sent is
/// moved aside by the sweeper, and the row behind it is dispatched, not blocked.
pub(crate) async fn a_refused_row_left_behind_does_not_block_the_sweeper(kind: Kind) {
    let env = StoreEnv::new(kind).await;
    let calls = Calls::default();
    let now = env.fx.clock.now();
    let mail = |id: &str| {
        courier::Message::to_envelope(&ConfirmationMail { email: "a@b".into() })
            .unwrap()
            .with_message_id(id)
    };
    match env.store.begin("signup", "gone", None, now).await.unwrap() {
        courier::Begin::Fresh(mut work) => {
            let rows = vec![
                (SESSIONS.to_owned(), false, mail("bad")),
                (MAIL.to_owned(), false, mail("good")),
            ];
            work.store_outgoing(rows, now).await.unwrap();
            work.commit().await.unwrap();
        }
        courier::Begin::Duplicate(_) => panic!("a fresh id"),
    }
    let signup = start(&env, &calls).await;
    env.fx.clock.advance(Duration::from_secs(40));
    eventually("the good row dispatched", || async {
        env.queued_ids(MAIL).await == vec!["good".to_owned()]
    })
    .await;
    eventually("the bad row moved aside", || async {
        signup.stats().outbox_dead_lettered == 1
    })
    .await;
    let aside = env.store.dead_lettered_outbox("signup", 10).await.unwrap();
    assert_eq!(aside.len(), 1);
    assert_eq!(aside[0].message.envelope.message_id, "bad");
    assert_eq!(aside[0].source_id, "gone");
    assert_eq!(aside[0].dead_lettered_at, env.fx.clock.now());
    eventually("the outbox emptied", || async {
        env.count(&table(&env, "outbox")).await == 0
    })
    .await;
    env.fx.clock.advance(Duration::from_secs(40));
    assert_eq!(env.queued_ids(MAIL).await.len(), 1, "sent once");
    assert_eq!(signup.stats().outbox_dead_lettered, 1);
    signup.shutdown().await.unwrap();
    env.finish().await;
}
