//! `courier history find TEXT` and `HistoryAdmin::find`: an operator who knows only what
//! a user typed (an e-mail address) finds the events that hold it and the saga instances
//! they name. A property over any text (quotes, backslashes, control characters, any
//! Unicode) written where a handler puts it: in a kept body and a saga state (JSON held
//! as a string in the event's detail, so escaped twice), in an error (escaped once), as a
//! message id; and the printed output with the command that follows.

use chrono::{DateTime, TimeZone, Utc};
use courier::admin::{HistoryAdmin, HistoryFilter, PostgresAdmin, SqliteAdmin};
use courier::{HistoryDetail, HistoryEvent, HistoryKind, PostgresStore, SagaChange, SqliteStore, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::courier;

fn at(seconds: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 3, 10, 0, 0).unwrap() + chrono::Duration::seconds(seconds)
}

/// Where a handler's value can be in an event.
#[derive(Debug, Clone, Copy)]
enum Place {
    Body,
    State,
    Error,
    MessageId,
}

/// An event of `accounts` holding `text` at `place`, naming instance `accounts.SignUp`
/// `correlation`.
fn event_holding(text: &str, place: Place, n: i64, correlation: &str) -> HistoryEvent {
    let json = serde_json::json!({ "user_id": correlation, "email": text }).to_string();
    let mut detail = HistoryDetail::default();
    detail.sagas.push(SagaChange {
        saga_type: "accounts.SignUp".into(),
        correlation: correlation.into(),
        after: Some(match place {
            Place::State => json.clone(),
            _ => r#"{"email":"elsewhere"}"#.into(),
        }),
        ..SagaChange::default()
    });
    let kind = match place {
        Place::Error => {
            detail.error = Some(format!("the mail server refused {text}"));
            HistoryKind::Retried
        }
        _ => HistoryKind::Handled,
    };
    if let Place::Body = place {
        detail.body = Some(json);
    }
    HistoryEvent {
        endpoint: "accounts".into(),
        kind,
        at: at(n),
        message_id: match place {
            Place::MessageId => text.into(),
            _ => format!("m-{n}"),
        },
        message_type: Some("accounts.UserRegistered".into()),
        conversation_id: None,
        causation_id: None,
        attempt: 1,
        enqueued_at: None,
        received_at: Some(at(n)),
        detail,
    }
}

/// Any non-empty text a user may type or a producer may send; NUL is left out on
/// Postgres (it stores it as U+FFFD, tests/store/history_rows.rs).
fn any_text(nul: bool) -> impl Strategy<Value = String> {
    let pattern = if nul {
        "[\\x00-\\x1f\"\\\\'a-z@.\u{80}-\u{10ffff}]{1,16}"
    } else {
        "[\\x01-\\x1f\"\\\\'a-z@.\u{80}-\u{10ffff}]{1,16}"
    };
    prop_oneof![
        pattern,
        Just("carol@example.com".to_owned()),
        Just("o'brien+\"x\"\\y@example.com".to_owned()),
    ]
}

/// Whatever is written and wherever, `find` returns that event and names its instance;
/// an event not holding the text is not returned.
async fn found_wherever_written(admin: &dyn HistoryAdmin, store: &dyn Store, text: String, place: Place, n: i64) {
    let correlation = format!("u-{n}");
    store
        .record_history(&event_holding(&text, place, n, &correlation))
        .await
        .unwrap();
    let found = admin.find(&text, &HistoryFilter::default()).await.unwrap();
    let ids: Vec<&str> = found.events.iter().map(|e| e.event.message_id.as_str()).collect();
    let id = match place {
        Place::MessageId => text.clone(),
        _ => format!("m-{n}"),
    };
    assert!(ids.contains(&id.as_str()), "{text:?} at {place:?}: found {ids:?}");
    assert!(
        found
            .instances
            .iter()
            .any(|i| i.saga_type == "accounts.SignUp" && i.correlation == correlation),
        "{text:?} at {place:?}: instances {:?}",
        found.instances
    );
}

fn run_property(nul: bool, case: impl Fn(String, Place, i64)) {
    let cases = std::env::var("COURIER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let place = prop_oneof![
        Just(Place::Body),
        Just(Place::State),
        Just(Place::Error),
        Just(Place::MessageId)
    ];
    let n = std::cell::Cell::new(0);
    runner
        .run(&(any_text(nul), place), |(text, place)| {
            n.set(n.get() + 1);
            case(text, place, n.get());
            Ok::<(), TestCaseError>(())
        })
        .unwrap();
}

#[test]
fn any_text_written_anywhere_is_found_on_sqlite() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (store, admin) = rt.block_on(async {
        let file = dir.path().join("store.db");
        let store = SqliteStore::open(&file).await.unwrap();
        store.migrate().await.unwrap();
        (store, SqliteAdmin::open(&file).await.unwrap())
    });
    run_property(true, |text, place, n| {
        rt.block_on(found_wherever_written(&admin, &store, text, place, n));
    });
    rt.block_on(async {
        let none = admin
            .find("nobody@example.com", &HistoryFilter::default())
            .await
            .unwrap();
        assert!(none.events.is_empty(), "{:?}", none.events);
        assert!(
            admin.find("", &HistoryFilter::default()).await.is_err(),
            "an empty text is refused"
        );
    });
}

#[test]
fn any_text_written_anywhere_is_found_on_postgres() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (db, store, admin) = rt.block_on(async {
        let db = courier::test_servers::postgres_database().await.unwrap();
        let store = PostgresStore::connect(&db.url()).await.unwrap();
        store.migrate().await.unwrap();
        let admin = PostgresAdmin::connect(&db.url()).await.unwrap();
        (db, store, admin)
    });
    run_property(false, |text, place, n| {
        rt.block_on(found_wherever_written(&admin, &store, text, place, n));
    });
    rt.block_on(async {
        let none = admin
            .find("nobody@example.com", &HistoryFilter::default())
            .await
            .unwrap();
        assert!(none.events.is_empty());
        // A text with NUL (an id or an error stored with U+FFFD, a body or a state with
        // it escaped) is found, wherever written, by what the producer wrote.
        for (n, place) in [Place::Body, Place::State, Place::Error, Place::MessageId]
            .into_iter()
            .enumerate()
        {
            let text = format!("nul\0here-{n}@example.com");
            let correlation = format!("u-nul-{n}");
            let n = 10_000 + i64::try_from(n).unwrap();
            store
                .record_history(&event_holding(&text, place, n, &correlation))
                .await
                .unwrap();
            let found = admin.find(&text, &HistoryFilter::default()).await.unwrap();
            assert!(
                found.instances.iter().any(|i| i.correlation == correlation),
                "{place:?}: {:?}",
                found.events
            );
        }
        drop(db);
    });
}

/// The printed answer: each event, the instances with the command for their timeline;
/// nothing found exits 3 saying why a text may not be stored.
#[tokio::test]
async fn the_command_prints_the_events_and_the_timeline_to_read_next() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    store
        .record_history(&event_holding("carol@example.com", Place::Body, 1, "u-7"))
        .await
        .unwrap();
    store
        .record_history(&event_holding("dave@example.com", Place::Body, 2, "u-8"))
        .await
        .unwrap();
    store
        .record_history(&event_holding("o'brien@example.com", Place::State, 3, "user 9"))
        .await
        .unwrap();
    let f = file.to_str().unwrap();

    let ran = courier(&["--sqlite", f, "history", "find", "carol@example.com"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let expected = [
        "carol@example.com found in 1 event(s), newest first",
        "  2026-12-03T10:00:01.000Z  accounts.UserRegistered m-1  handled  [accounts, attempt 1]",
        "saga instances they name, the most recently touched first:",
        "  accounts.SignUp u-7: 1 event(s), the last at 2026-12-03T10:00:01.000Z; its timeline: courier history saga \
         accounts.SignUp u-7",
    ];
    assert_eq!(ran.stdout.lines().collect::<Vec<_>>(), expected, "{}", ran.stdout);

    // A correlation that is not one shell word is quoted, so the command can be pasted.
    let ran = courier(&["--sqlite", f, "history", "find", "o'brien@example.com"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout
            .contains("its timeline: courier history saga accounts.SignUp 'user 9'"),
        "{}",
        ran.stdout
    );

    let ran = courier(&["--sqlite", f, "--json", "history", "find", "example.com"], "");
    let json: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(json["events"].as_array().unwrap().len(), 3);
    assert_eq!(json["instances"][0]["correlation"], "user 9", "the newest first");

    let ran = courier(&["--sqlite", f, "history", "find", "erin@example.com"], "");
    assert_eq!(ran.code, 3, "{}", ran.stdout);
    assert!(ran.stderr.contains("HistoryOptions::redact"), "{}", ran.stderr);

    let ran = courier(&["--sqlite", f, "history", "find", ""], "");
    assert_ne!(ran.code, 0);
    assert!(ran.stderr.contains("give the text to find"), "{}", ran.stderr);
}
