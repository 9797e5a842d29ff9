//! Property tests of what a receiver decodes from messages and rows it does not control,
//! beyond the wire formats (those are in `amqp/fuzz.rs` and the store's `fuzz` module):
//! the `traceparent` header, a message body with any content type, any version header
//! and any saga headers, and a saga state stored by other code at any version. Nothing may panic; every failure is a value.
//!
//! `cargo test -p courier --lib fuzz` runs a short version (256 cases each);
//! `COURIER_FUZZ_CASES=200000` a long one (docs/reliability.md).

use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use crate::endpoint::trace::TraceContext;
use crate::message::{Envelope, PropertyValue};
use crate::saga::{Saga, SagaHandlers};
use crate::store::StoredSaga;

/// The number of cases each property test runs: `COURIER_FUZZ_CASES`, or 256 (shared by
/// every fuzz module of the crate).
pub(crate) fn cases() -> u32 {
    std::env::var("COURIER_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256)
}

/// Text near the `traceparent` format, and anything else.
fn traceparent() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9a-fA-F]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}",
        "[0-9a-f]{2}-[0-9a-fx]{30,34}-[0-9a-f]{14,18}-[0-9a-f]{1,3}(-[ -~]{0,8})?",
        "[ -~]{0,80}",
        any::<String>(),
    ]
}

fn property_value() -> impl Strategy<Value = PropertyValue> {
    prop_oneof![
        any::<bool>().prop_map(PropertyValue::Bool),
        any::<i64>().prop_map(PropertyValue::Int),
        any::<f64>().prop_map(PropertyValue::Float),
        "[ -~]{0,40}".prop_map(PropertyValue::String),
        any::<String>().prop_map(PropertyValue::String),
    ]
}

/// A received envelope of `message_type`: any body, content type, version header and
/// saga headers.
fn envelope() -> impl Strategy<Value = Envelope> {
    let names = prop::sample::select(vec![
        crate::endpoint::version::headers::MESSAGE_VERSION,
        crate::saga::headers::TIMEOUT_ID,
        crate::saga::headers::SAGA_TYPE,
        crate::saga::headers::CORRELATION,
        crate::saga::headers::TIMEOUT_KEY,
        crate::saga::headers::TIMEOUT_DUE,
        crate::saga::headers::TIMEOUT_SEAL,
        "traceparent",
        "x-other",
    ]);
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        r#"\{"n":-?[0-9]{1,25}(,"[a-z]{1,3}":[^}]{0,10})?\}"#.prop_map(String::into_bytes),
        Just(b"null".to_vec()),
    ];
    let content_type = proptest::option::of(prop_oneof![
        Just("application/json".to_owned()),
        Just("application/json; charset=utf-8".to_owned()),
        "[ -~]{0,30}",
    ]);
    (
        body,
        content_type,
        proptest::collection::vec((names, property_value()), 0..6),
    )
        .prop_map(|(body, content_type, properties)| {
            let mut envelope = Envelope::new(body);
            envelope.message_type = Some("fuzz.Probe".to_owned());
            envelope.content_type = content_type;
            envelope.properties = properties.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            envelope
        })
}

#[derive(Debug, Serialize, Deserialize, crate::Message)]
#[message(name = "fuzz.Probe", version = 2, upcast = Self::upcast)]
struct Probe {
    n: i64,
}

impl Probe {
    fn upcast(from: u32, body: serde_json::Value) -> Result<serde_json::Value, crate::UpcastError> {
        match (from, body) {
            (1, serde_json::Value::Object(mut fields)) => {
                let n = fields.remove("count").unwrap_or(serde_json::Value::from(0));
                fields.insert("n".to_owned(), n);
                Ok(serde_json::Value::Object(fields))
            }
            (1, _) => Err(crate::UpcastError::invalid("not an object")),
            (v, _) => Err(crate::UpcastError::unsupported(v)),
        }
    }
}

/// A saga at version 3 whose migration reads fields it expects to find.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    entries: Vec<u32>,
    owner: String,
}

impl Saga for Ledger {
    const NAME: &'static str = "fuzz.Ledger";
    const VERSION: u32 = 3;

    fn register(_handlers: &mut SagaHandlers<Self>) {}

    fn migrate(from: u32, state: serde_json::Value) -> Result<serde_json::Value, crate::UpcastError> {
        let serde_json::Value::Object(mut fields) = state else {
            return Err(crate::UpcastError::invalid("not an object"));
        };
        match from {
            1 => {
                let entry = fields.remove("entry").unwrap_or(serde_json::Value::from(0));
                fields.insert("entries".to_owned(), serde_json::Value::from(vec![entry]));
            }
            2 => {
                fields.entry("owner").or_insert(serde_json::Value::from(""));
            }
            v => return Err(crate::UpcastError::unsupported(v)),
        }
        Ok(serde_json::Value::Object(fields))
    }
}

fn stored_state() -> impl Strategy<Value = StoredSaga> {
    let state = prop_oneof![
        any::<String>(),
        r#"\{("entry":[0-9]{1,12}|"entries":\[[0-9,]{0,12}\]|"owner":"[a-z]{0,5}"|"x":null)?\}"#,
        Just(String::new()),
        Just("[]".to_owned()),
    ];
    (state, any::<i64>(), prop_oneof![any::<i64>(), -1i64..6]).prop_map(|(state, version, state_version)| StoredSaga {
        state,
        version,
        state_version,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Any text: parsed or refused; what parses prints back to what parses the same.
    #[test]
    fn a_traceparent_parses_or_is_refused(text in traceparent()) {
        if let Some(context) = TraceContext::parse(&text) {
            let printed = context.to_string();
            prop_assert_eq!(TraceContext::parse(&printed), Some(context));
            prop_assert_eq!(printed.len(), 55);
        }
    }

    /// A body of any shape, with any content type, version header and saga headers,
    /// decodes to the message or to a failure that says why; and, reaching a saga's
    /// timeout handler, is never taken for the timeout dispatcher's copy (it carries no
    /// seal the endpoint made).
    #[test]
    fn a_received_message_decodes_or_fails_with_a_reason(envelope in envelope()) {
        let seal = crate::endpoint::timeout_seal::TimeoutSeal::new(&crate::store::EndpointSecret::from_bytes([3; 32]))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let verdict = crate::endpoint::timeout_seal::judge(Some(&seal), "e", &envelope, chrono::DateTime::<chrono::Utc>::MAX_UTC);
        prop_assert!(matches!(verdict, crate::endpoint::timeout_seal::Verdict::Forged(_)), "{:?}", verdict);
        match crate::endpoint::version::decode_message::<Probe>(&envelope) {
            // Decoded: at version 2, or brought up from version 1 by the upcast.
            Ok(_) => {}
            Err(failure) => {
                // Refused for good (no retry can help), with a text that says why.
                prop_assert!(failure.permanent_reason().is_some());
                prop_assert!(failure.chain().iter().all(|t| !t.is_empty()));
            }
        }
    }

    /// A stored state of any text and any version reads as the state or as an error
    /// that names the instance.
    #[test]
    fn a_stored_saga_state_decodes_or_fails_with_a_reason(stored in stored_state()) {
        match crate::saga::state::decode_state::<Ledger>(&stored, "c-1") {
            Ok(ledger) => prop_assert!(ledger.entries.len() <= stored.state.len()),
            Err(error) => {
                let text = error.chain().join(": ");
                prop_assert!(text.contains("c-1"), "{}", text);
            }
        }
    }
}
