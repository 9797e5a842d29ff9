//! The checks every transport applies to a message before it is accepted: size, ids,
//! time-to-live and scheduled time (the embedded broker, RabbitMQ and Postgres refuse the
//! same messages with the same errors).

use chrono::{DateTime, Utc};

use crate::error::{Error, ErrorKind, Result};
use crate::message::Envelope;

/// The default limit on a message's size: 1 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 1024 * 1024;
/// The longest message id accepted.
pub const MAX_MESSAGE_ID_LEN: usize = 128;
/// How far ahead a message may be scheduled (about 100 years).
const MAX_SCHEDULE_AHEAD: chrono::Duration = chrono::Duration::days(100 * 366);

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
