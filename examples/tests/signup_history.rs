//! The walkthrough of docs/operations.md ("I signed up and my account is gone") on a real
//! run of the sign-up example: a user who never confirmed is found from her e-mail
//! address, her sign-up's timeline tells how it ended (registered, the confirmation mail
//! sent, the timeout sent and fired, completed, the removal published), and the
//! two-factor codes the example redacts are in no event. On the embedded default, and
//! (feature `servers`) on RabbitMQ with the history in Postgres.

#![cfg(unix)]
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout)] // a test program

use std::process::Command;

use courier::HistoryKind;
use courier::admin::{EmbeddedAdmin, HistoryAdmin, HistoryFilter};

const SIGNUP: &str = env!("CARGO_BIN_EXE_signup");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_whose_confirmation_expired_is_found_from_her_email_address() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(SIGNUP)
        .current_dir(dir.path())
        .args(["--db", "signup.db"])
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("RUST_LOG")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let admin = EmbeddedAdmin::open_read_only(dir.path().join("signup.db"))
        .await
        .unwrap();
    walkthrough(&admin, &stdout).await;
}

/// The same on RabbitMQ, the sagas, inbox and history in Postgres (a database and a
/// virtual host of the test's own); time 250 times faster, as tests/signup_postgres.rs
/// runs it.
#[cfg(feature = "servers")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_and_postgres_the_history_tells_the_same() {
    let db = courier::test_servers::postgres_database().await.unwrap();
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(SIGNUP)
        .current_dir(dir.path())
        .args([
            "--rabbitmq",
            vhost.url(),
            "--postgres",
            &db.url(),
            "--scale",
            "250",
            "--fresh",
        ])
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("COURIER_TRANSPORT")
        .env_remove("RUST_LOG")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let admin = courier::admin::PostgresAdmin::connect(&db.url()).await.unwrap();
    walkthrough(&admin, &stdout).await;
}

/// The walkthrough's three steps on a finished run's history; `stdout` is what it printed.
async fn walkthrough(admin: &dyn HistoryAdmin, stdout: &str) {
    assert!(
        stdout.contains("erin   never confirmed -> removed after 1 h"),
        "{stdout}"
    );
    // 1. From what she typed to her sign-up.
    let found = admin.find("erin@example.com", &HistoryFilter::default()).await.unwrap();
    let signups: Vec<&str> = found
        .instances
        .iter()
        .filter(|i| i.saga_type == "accounts.SignUp")
        .map(|i| i.correlation.as_str())
        .collect();
    assert_eq!(signups.len(), 1, "{:?}", found.instances);
    let erin = signups[0];
    assert!(erin.starts_with("erin-"), "{erin}");

    // 2. Its timeline: registered, timeout sent, timeout handled and completed.
    let timeline = admin
        .saga_history("accounts.SignUp", erin, &HistoryFilter::default())
        .await
        .unwrap();
    let steps: Vec<(HistoryKind, Option<&str>)> = timeline
        .events
        .iter()
        .map(|e| (e.event.kind, e.event.message_type.as_deref()))
        .collect();
    assert_eq!(
        steps,
        [
            (HistoryKind::Handled, Some("accounts.UserRegistered")),
            (HistoryKind::TimeoutDispatched, Some("accounts.ConfirmationExpired")),
            (HistoryKind::Handled, Some("accounts.ConfirmationExpired")),
        ]
    );
    let started = &timeline.events[0].event.detail;
    assert!(
        started
            .sent
            .iter()
            .any(|m| m.message_type.as_deref() == Some("mailer.SendConfirmationMail")),
        "{started:?}"
    );
    let ended = &timeline.events[2].event.detail;
    assert!(ended.sagas.iter().any(|s| s.completed), "{ended:?}");
    assert!(
        ended
            .sent
            .iter()
            .any(|m| m.message_type.as_deref() == Some("accounts.UserRemoved")),
        "{ended:?}"
    );

    // 3. The mail went out: mailer handled it.
    let mail = &started.sent[0].message_id;
    let sent = admin.message_history(mail, &HistoryFilter::default()).await.unwrap();
    assert!(
        sent.root
            .events
            .iter()
            .any(|e| e.event.kind == HistoryKind::Handled && e.event.endpoint == "mailer"),
        "{sent:?}"
    );

    // The example redacts the two-factor codes: carol's, printed by the run, is in no
    // event's body or state.
    let code = stdout
        .lines()
        .find_map(|l| l.split("carol").nth(1)?.split("login code ").nth(1)?.split(' ').next())
        .expect("carol's code in the story");
    let member = format!(r#""code":"{code}""#);
    let none = admin.find(&member, &HistoryFilter::default()).await.unwrap();
    assert!(none.events.is_empty(), "{member} kept: {:?}", none.events);
    let redacted = admin
        .find(r#""code":"[redacted]""#, &HistoryFilter::default())
        .await
        .unwrap();
    assert!(!redacted.events.is_empty(), "the codes are written as redacted");
}
