//! The checks every transport applies to a message before it is accepted: size, ids,
//! time-to-live and scheduled time (the embedded broker, RabbitMQ and Postgres refuse the
//! same messages with the same errors).

use chrono::{DateTime, Utc};

use crate::error::{Error, ErrorKind, Result};
use crate::message::Envelope;
use crate::message::reasons::{INVALID_WIRE_FORMAT, MESSAGE_TOO_LARGE};

/// The default limit on a message's size: 1 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 1024 * 1024;
/// The longest message id accepted.
pub const MAX_MESSAGE_ID_LEN: usize = 128;
/// How far ahead a message may be scheduled (about 100 years).
pub(crate) const MAX_SCHEDULE_AHEAD: chrono::Duration = chrono::Duration::days(100 * 366);

/// The checks a message passes before it is accepted for `entity` (every transport
/// applies the same).
pub(crate) fn check_envelope(
    max_message_size: usize,
    m: &Envelope,
    entity: &str,
    requires_session: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let invalid = |reason: String| Err(Error::new(ErrorKind::InvalidMessage { reason }));
    let size = m.size();
    if size > max_message_size {
        return Err(Error::new(ErrorKind::MessageTooLarge {
            size,
            limit: max_message_size,
        }));
    }
    if m.message_id.is_empty() || m.message_id.len() > MAX_MESSAGE_ID_LEN {
        return invalid(format!(
            "the message id must have 1 to {MAX_MESSAGE_ID_LEN} bytes, it has {}",
            m.message_id.len()
        ));
    }
    if let Some(s) = &m.session_id {
        if s.is_empty() || s.len() > MAX_MESSAGE_ID_LEN {
            return invalid(format!("the session id must have 1 to {MAX_MESSAGE_ID_LEN} bytes"));
        }
    } else if requires_session {
        return invalid(format!("{entity} requires sessions: set a session id"));
    }
    if let Some(ttl) = m.time_to_live
        && (ttl.is_zero() || ttl > crate::entity::MAX_TIME_TO_LIVE)
    {
        return invalid(format!("time-to-live {ttl:?} must be between 1 ms and 100 years"));
    }
    if let Some(at) = m.scheduled_enqueue_time {
        check_schedule(at, now)?;
    }
    if let Some((key, _)) = m
        .properties
        .iter()
        .find(|(_, v)| matches!(v, crate::message::PropertyValue::Float(f) if !f.is_finite()))
    {
        // JSON has no infinity or NaN: the embedded broker and Postgres would store null,
        // which no receiver reads back as the value sent; and RabbitMQ 3.10 closes the
        // connection of a publish whose headers hold one (INTERNAL_ERROR).
        return invalid(format!(
            "property {key:?} is a float that is not finite; property floats must be finite numbers"
        ));
    }
    Ok(())
}

/// Checks a scheduled enqueue time: from 1970 on, at most 100 years ahead (every
/// transport refuses the same times).
pub(crate) fn check_schedule(at: DateTime<Utc>, now: DateTime<Utc>) -> Result<()> {
    let refuse = |reason| {
        Err(Error::new(ErrorKind::InvalidScheduleTime {
            time: at.to_rfc3339(),
            reason,
        }))
    };
    if at.timestamp() < 0 {
        return refuse("it is before 1970-01-01");
    }
    if at > now + MAX_SCHEDULE_AHEAD {
        return refuse("it is more than 100 years ahead");
    }
    Ok(())
}

/// The most bytes of a bad field a dead-letter description quotes.
const QUOTED_BYTES: usize = 256;

/// What a receiver found in a field it could not read, for a dead-letter description:
/// the bytes as printable ASCII with escapes, cut after 256 bytes (saying how many there
/// were).
pub(crate) fn quoted(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(QUOTED_BYTES)];
    let mut s = cut.escape_ascii().to_string();
    if cut.len() < bytes.len() {
        s.push_str(&format!("... ({} bytes in all)", bytes.len()));
    }
    s
}

/// The problem a receiver names when a message's properties are not a JSON object of
/// property values (booleans, integers, floats, strings).
pub(crate) fn unreadable_properties(error: &serde_json::Error, json: &str) -> String {
    format!(
        "its properties are not a JSON object of property values (booleans, integers, floats, strings): {error}: \
         \"{}\"",
        quoted(json.as_bytes())
    )
}

/// Why a receiver refuses a message it read back: the dead-letter reason and the
/// description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: &'static str,
    pub(crate) description: String,
}

/// What a receiver of the embedded broker or the Postgres transport refuses in a stored
/// message that another program wrote: `unreadable` (what could not be read as written,
/// already described), and what a Courier sender would have refused (an id or a session
/// id of more than 128 bytes, a time-to-live outside 1 ms to 100 years, a message over
/// `max_message_size`, named by `setting`).
/// RabbitMQ's receiver refuses the same (`amqp/inspect.rs`). The reason is
/// `courier.MessageTooLarge` when the size is the only problem, else
/// `courier.InvalidWireFormat`. An empty message id is not refused here: the endpoint
/// decides (`courier.MissingMessageId`, or `accept_messages_without_id`).
pub(crate) fn stored_refusal(
    unreadable: Option<String>,
    m: &Envelope,
    max_message_size: usize,
    setting: &str,
) -> Option<Refusal> {
    let mut problems: Vec<String> = unreadable.into_iter().collect();
    if m.message_id.len() > MAX_MESSAGE_ID_LEN {
        problems.push(format!(
            "message_id has {} bytes; Courier's message ids have 1 to {MAX_MESSAGE_ID_LEN} (a Courier sender \
             refuses a longer one): \"{}\"",
            m.message_id.len(),
            quoted(m.message_id.as_bytes())
        ));
    }
    if let Some(s) = &m.session_id
        && (s.is_empty() || s.len() > MAX_MESSAGE_ID_LEN)
    {
        problems.push(format!(
            "session_id has {} bytes; Courier's session ids have 1 to {MAX_MESSAGE_ID_LEN}",
            s.len()
        ));
    }
    if let Some(ttl) = m.time_to_live
        && (ttl.is_zero() || ttl > crate::entity::MAX_TIME_TO_LIVE)
    {
        // A sender refuses it, and a delayed retry (a copy with the same time-to-live)
        // could not be scheduled: the retry policy would be skipped.
        problems.push(format!(
            "its time-to-live is {} ms; Courier's time-to-lives are 1 ms to 100 years (a Courier sender refuses \
             another)",
            ttl.as_millis()
        ));
    }
    let size = m.size();
    let too_large = size > max_message_size;
    if too_large {
        problems.push(format!(
            "the message has {size} bytes (body, ids and properties); this transport's limit is \
             {max_message_size} ({setting})"
        ));
    }
    (!problems.is_empty()).then(|| Refusal {
        reason: if too_large && problems.len() == 1 {
            MESSAGE_TOO_LARGE
        } else {
            INVALID_WIRE_FORMAT
        },
        description: problems.join("; "),
    })
}

/// The dead-letter description of a stored message in the scheduled state without a
/// scheduled time (another program's row): it would never become due.
pub(crate) const NO_SCHEDULED_TIME: &str =
    "the message is stored as scheduled but has no scheduled time, so it would never become due";
/// The dead-letter description of a stored message scheduled more than 100 years ahead
/// (another program's row), around the time (RFC 3339, UTC).
pub(crate) const FAR_SCHEDULE: [&str; 2] = [
    "the message is scheduled for ",
    ", more than 100 years ahead, which no Courier sender accepts (a time in the wrong unit?); it would never \
     become due",
];

/// The dead-letter description of a stored message in the scheduled state that no
/// Courier sender could have scheduled: `at` more than 100 years after `now`, or no time
/// at all. `None` when `at` is a time a sender accepts.
pub(crate) fn impossible_schedule(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<String> {
    match at {
        None => Some(NO_SCHEDULED_TIME.to_owned()),
        Some(at) if at > now + MAX_SCHEDULE_AHEAD => Some(format!(
            "{}{}{}",
            FAR_SCHEDULE[0],
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            FAR_SCHEDULE[1]
        )),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::message::PropertyValue;

    #[test]
    fn a_stored_time_to_live_out_of_range_is_refused_at_receive() {
        for ttl in [
            Duration::ZERO,
            crate::entity::MAX_TIME_TO_LIVE + Duration::from_millis(1),
        ] {
            let m = Envelope::new("{}").with_time_to_live(ttl);
            let refusal = stored_refusal(None, &m, DEFAULT_MAX_MESSAGE_SIZE, "x").unwrap();
            assert_eq!(refusal.reason, INVALID_WIRE_FORMAT);
            assert!(refusal.description.contains("time-to-live"), "{}", refusal.description);
        }
        let m = Envelope::new("{}").with_time_to_live(crate::entity::MAX_TIME_TO_LIVE);
        assert!(stored_refusal(None, &m, DEFAULT_MAX_MESSAGE_SIZE, "x").is_none());
    }

    #[test]
    fn a_float_property_that_is_not_finite_is_refused_at_send() {
        for f in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            let m = Envelope::new("{}").with_property("x", PropertyValue::Float(f));
            let e = check_envelope(DEFAULT_MAX_MESSAGE_SIZE, &m, "q", false, Utc::now()).unwrap_err();
            assert!(e.to_string().contains("not finite"), "{e}");
        }
        let m = Envelope::new("{}").with_property("x", PropertyValue::Float(1.5));
        assert!(check_envelope(DEFAULT_MAX_MESSAGE_SIZE, &m, "q", false, Utc::now()).is_ok());
    }
}
