//! The envelope as a store keeps it ([`StoredEnvelope`]): its fields other than the body as
//! JSON text, beside the body (the outbox, saga timeouts, the RabbitMQ transport's scheduled
//! messages); and the property tests of reading a stored row back.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, PropertyValue};

/// The envelope's fields other than the body, as the outbox stores them.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredEnvelope {
    pub(crate) message_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) correlation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) causation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) content_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) properties: BTreeMap<String, PropertyValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) time_to_live_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) scheduled_enqueue_time: Option<DateTime<Utc>>,
}

impl StoredEnvelope {
    pub(crate) fn split(envelope: Envelope) -> Result<(String, Bytes)> {
        let meta = StoredEnvelope {
            message_id: envelope.message_id,
            correlation_id: envelope.correlation_id,
            causation_id: envelope.causation_id,
            message_type: envelope.message_type,
            content_type: envelope.content_type,
            properties: envelope.properties,
            session_id: envelope.session_id,
            reply_to: envelope.reply_to,
            time_to_live_ms: envelope
                .time_to_live
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            scheduled_enqueue_time: envelope.scheduled_enqueue_time,
        };
        let json = serde_json::to_string(&meta).map_err(|e| {
            Error::with_source(
                ErrorKind::InvalidMessage {
                    reason: "cannot store the envelope in the outbox".into(),
                },
                e,
            )
        })?;
        Ok((json, envelope.body))
    }

    pub(crate) fn join(json: &str, body: Vec<u8>) -> Result<Envelope> {
        let meta: StoredEnvelope = serde_json::from_str(json).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt {
                    detail: "an outbox row's envelope does not parse".into(),
                },
                e,
            )
        })?;
        let mut envelope = Envelope::new(body);
        envelope.message_id = meta.message_id;
        envelope.correlation_id = meta.correlation_id;
        envelope.causation_id = meta.causation_id;
        envelope.message_type = meta.message_type;
        envelope.content_type = meta.content_type;
        envelope.properties = meta.properties;
        envelope.session_id = meta.session_id;
        envelope.reply_to = meta.reply_to;
        envelope.time_to_live = meta.time_to_live_ms.map(Duration::from_millis);
        envelope.scheduled_enqueue_time = meta.scheduled_enqueue_time;
        Ok(envelope)
    }
}

/// Property tests of the outbox's and the timeouts' stored envelopes: any row text and
/// body is read back or refused as `Corrupt`, never a panic; whatever a handler sends is
/// stored and read back the same. `COURIER_FUZZ_CASES` sets the number of cases.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::StoredEnvelope;
    use crate::error::ErrorKind;
    use crate::message::{Envelope, PropertyValue};

    use crate::fuzz::cases;

    fn property() -> impl Strategy<Value = PropertyValue> {
        prop_oneof![
            "\\PC{0,20}".prop_map(PropertyValue::String),
            any::<i64>().prop_map(PropertyValue::Int),
            any::<bool>().prop_map(PropertyValue::Bool),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn any_row_reads_back_or_is_corrupt(json in "\\PC{0,200}", body in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Err(e) = StoredEnvelope::join(&json, body) {
                prop_assert!(matches!(e.kind(), ErrorKind::Corrupt { .. }), "{}", e);
            }
        }

        #[test]
        fn a_stored_envelope_reads_back_the_same(
            id in "[a-z0-9-]{1,128}",
            kind in proptest::option::of("\\PC{0,40}"),
            correlation in proptest::option::of("\\PC{0,40}"),
            properties in proptest::collection::btree_map("[a-z.]{1,16}", property(), 0..6),
            body in proptest::collection::vec(any::<u8>(), 0..64),
            ttl_ms in proptest::option::of(0u64..10_000_000),
        ) {
            let mut e = Envelope::new(body).with_message_id(id);
            e.message_type = kind;
            e.correlation_id = correlation;
            e.properties = properties.into_iter().collect();
            e.time_to_live = ttl_ms.map(std::time::Duration::from_millis);
            let (json, bytes) = StoredEnvelope::split(e.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let back = StoredEnvelope::join(&json, bytes.to_vec()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, e);
        }
    }
}
