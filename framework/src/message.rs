//! The message model: the envelope a sender fills in and the properties the broker adds.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::codec::{Codec, CodecError};

/// The broker-assigned sequence number of a message (S3.1).
pub type SequenceNumber = i64;

/// Application properties of a message: small typed values a receiver can read without
/// decoding the body.
pub type Properties = BTreeMap<String, PropertyValue>;

/// The value of an application property.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PropertyValue {
    /// A boolean.
    Bool(bool),
    /// A 64-bit integer.
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// A string.
    String(String),
}

impl From<bool> for PropertyValue {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}
impl From<i64> for PropertyValue {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}
impl From<i32> for PropertyValue {
    fn from(v: i32) -> Self {
        Self::Int(i64::from(v))
    }
}
impl From<f64> for PropertyValue {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}
impl From<&str> for PropertyValue {
    fn from(v: &str) -> Self {
        Self::String(v.to_owned())
    }
}
impl From<String> for PropertyValue {
    fn from(v: String) -> Self {
        Self::String(v)
    }
}

impl fmt::Display for PropertyValue {
    /// The value as text: `true`, `42`, `1.5`, or the string itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PropertyValue::Bool(v) => v.fmt(f),
            PropertyValue::Int(v) => v.fmt(f),
            PropertyValue::Float(v) => v.fmt(f),
            PropertyValue::String(v) => f.write_str(v),
        }
    }
}

impl PropertyValue {
    /// The length this value counts for in the message size.
    pub(crate) fn size(&self) -> usize {
        match self {
            PropertyValue::Bool(_) => 1,
            PropertyValue::Int(_) | PropertyValue::Float(_) => 8,
            PropertyValue::String(s) => s.len(),
        }
    }
}

/// A message as its sender fills it in.
///
/// `message_id` is chosen by the sender (a new UUIDv7 by default) and kept through every
/// redelivery, so a receiver can recognise a message it has already processed (S2.8).
/// `Debug` shows the body's length, never its content.
#[derive(Clone, PartialEq)]
pub struct Envelope {
    /// Sender-chosen id, at most 128 characters; kept on every delivery. Every transport
    /// refuses to send a message without one; a received message has an empty id when a
    /// producer outside Courier sent it without one (RabbitMQ's `message_id` unset).
    pub message_id: String,
    /// Id shared by the messages of one conversation or workflow.
    pub correlation_id: Option<String>,
    /// Id of the message whose handling caused this one.
    pub causation_id: Option<String>,
    /// Stable wire name of the message type.
    pub message_type: Option<String>,
    /// MIME type of the body (`application/json` for the default codec).
    pub content_type: Option<String>,
    /// The encoded body.
    pub body: Bytes,
    /// Application properties.
    pub properties: Properties,
    /// Session (ordered group) this message belongs to (S4).
    pub session_id: Option<String>,
    /// Where replies should go.
    pub reply_to: Option<String>,
    /// How long the message stays valid after it is enqueued; after that it is
    /// dead-lettered with the reason [`reasons::TTL_EXPIRED`].
    pub time_to_live: Option<Duration>,
    /// When the message should become visible (S5.1); `None` means now.
    pub scheduled_enqueue_time: Option<DateTime<Utc>>,
}

impl Envelope {
    /// A message with this body and a new UUIDv7 message id.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            message_id: Uuid::now_v7().to_string(),
            correlation_id: None,
            causation_id: None,
            message_type: None,
            content_type: None,
            body: body.into(),
            properties: Properties::new(),
            session_id: None,
            reply_to: None,
            time_to_live: None,
            scheduled_enqueue_time: None,
        }
    }

    /// A message whose body is `value` encoded with `codec`; sets the content type.
    ///
    /// # Errors
    /// The codec's error if `value` cannot be encoded.
    pub fn encode<C: Codec, T: Serialize + ?Sized>(codec: &C, value: &T) -> Result<Self, CodecError> {
        let body = codec.encode(value)?;
        Ok(Self::new(body).with_content_type(codec.content_type()))
    }

    /// A message whose body is `value` as JSON.
    ///
    /// # Errors
    /// If `value` cannot be serialized.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Self, CodecError> {
        Self::encode(&crate::codec::JsonCodec, value)
    }

    /// Sets the message id.
    #[must_use]
    pub fn with_message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = id.into();
        self
    }
    /// Sets the correlation id.
    #[must_use]
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }
    /// Sets the causation id.
    #[must_use]
    pub fn with_causation_id(mut self, id: impl Into<String>) -> Self {
        self.causation_id = Some(id.into());
        self
    }
    /// Sets the message type name.
    #[must_use]
    pub fn with_message_type(mut self, name: impl Into<String>) -> Self {
        self.message_type = Some(name.into());
        self
    }
    /// Sets the content type.
    #[must_use]
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }
    /// Adds an application property.
    #[must_use]
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<PropertyValue>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }
    /// Sets the session id.
    #[must_use]
    pub fn with_session_id(mut self, id: impl Into<String>) -> Self {
        self.session_id = Some(id.into());
        self
    }
    /// Sets the reply-to address.
    #[must_use]
    pub fn with_reply_to(mut self, to: impl Into<String>) -> Self {
        self.reply_to = Some(to.into());
        self
    }
    /// Sets the time-to-live.
    #[must_use]
    pub fn with_time_to_live(mut self, ttl: Duration) -> Self {
        self.time_to_live = Some(ttl);
        self
    }
    /// Sets the scheduled enqueue time (S5.1).
    #[must_use]
    pub fn with_scheduled_enqueue_time(mut self, at: DateTime<Utc>) -> Self {
        self.scheduled_enqueue_time = Some(at);
        self
    }

    /// The size the message counts for against a broker's limit: body, ids, headers and
    /// properties, in bytes.
    pub fn size(&self) -> usize {
        let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        self.body.len()
            + self.message_id.len()
            + opt(&self.correlation_id)
            + opt(&self.causation_id)
            + opt(&self.message_type)
            + opt(&self.content_type)
            + opt(&self.session_id)
            + opt(&self.reply_to)
            + self.properties.iter().map(|(k, v)| k.len() + v.size()).sum::<usize>()
    }

    /// Decodes the body with `codec`.
    ///
    /// # Errors
    /// [`CodecError::ContentTypeMismatch`] if the message says it is of a content type
    /// the codec does not read ([`Codec::check_content_type`]: media types match
    /// without regard to case, with parameters), or the codec's error if the body does
    /// not decode.
    pub fn decode<C: Codec, T: serde::de::DeserializeOwned>(&self, codec: &C) -> Result<T, CodecError> {
        if let Some(ct) = &self.content_type {
            codec.check_content_type(ct)?;
        }
        codec.decode(&self.body)
    }
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("message_id", &self.message_id)
            .field("correlation_id", &self.correlation_id)
            .field("causation_id", &self.causation_id)
            .field("message_type", &self.message_type)
            .field("content_type", &self.content_type)
            .field("body_len", &self.body.len())
            .field("properties", &self.properties.keys().collect::<Vec<_>>())
            .field("session_id", &self.session_id)
            .field("reply_to", &self.reply_to)
            .field("time_to_live", &self.time_to_live)
            .field("scheduled_enqueue_time", &self.scheduled_enqueue_time)
            .finish()
    }
}

/// Where a message is in its life at the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageState {
    /// Receivable (possibly locked by a receiver right now).
    Active,
    /// Waiting for its scheduled enqueue time (S5.2).
    Scheduled,
    /// Set aside; receivable only by sequence number (S2.5).
    Deferred,
    /// In the dead-letter sub-queue.
    DeadLettered,
}

/// An opaque token that names one lock on one message.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockToken(Uuid);

impl LockToken {
    /// A token from its UUID form (as a transport issued it, or as a user typed it in).
    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }
    /// The token's UUID form.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockToken({})", self.0)
    }
}

impl FromStr for LockToken {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// What the broker adds to a message it accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerProperties {
    /// Gap-free, increasing number within the queue or topic (S3.1).
    pub sequence_number: SequenceNumber,
    /// When the broker enqueued (or activated) the message, UTC (S3.2).
    pub enqueued_time: DateTime<Utc>,
    /// How many times the message has been locked (S2.6).
    pub delivery_count: u32,
    /// The lock held by this delivery, if it is a PeekLock delivery.
    pub lock_token: Option<LockToken>,
    /// Until when the lock is held.
    pub locked_until: Option<DateTime<Utc>>,
    /// Where the message is.
    pub state: MessageState,
    /// When the message expires (enqueued time plus time-to-live).
    pub expires_at: Option<DateTime<Utc>>,
    /// Why the message was dead-lettered.
    pub dead_letter_reason: Option<String>,
    /// The detail given with the dead-letter reason.
    pub dead_letter_description: Option<String>,
    /// The entity the message was dead-lettered from.
    pub dead_letter_source: Option<String>,
}

/// A message as a receiver or a browser sees it: the sender's envelope and the broker's
/// properties.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedMessage {
    /// What the sender set.
    pub envelope: Envelope,
    /// What the broker set.
    pub broker: BrokerProperties,
}

impl ReceivedMessage {
    /// The sender-chosen message id.
    pub fn message_id(&self) -> &str {
        &self.envelope.message_id
    }
    /// The broker's sequence number.
    pub fn sequence_number(&self) -> SequenceNumber {
        self.broker.sequence_number
    }
    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.envelope.body
    }
    /// The delivery count.
    pub fn delivery_count(&self) -> u32 {
        self.broker.delivery_count
    }
}

/// Dead-letter reasons the broker itself writes.
pub mod reasons {
    /// The message was locked more often than the queue's max delivery count (S2.6).
    pub const MAX_DELIVERY_COUNT_EXCEEDED: &str = "MaxDeliveryCountExceeded";
    /// The message's time-to-live ran out before it was received.
    pub const TTL_EXPIRED: &str = "TTLExpiredException";
    /// A receiver refused the message: it breaks the transport's wire format (on RabbitMQ,
    /// a text property or header name that is not UTF-8, a message id of more than 128
    /// bytes, ...). The description names each property and gives the bytes received.
    pub const INVALID_WIRE_FORMAT: &str = "courier.InvalidWireFormat";
    /// A receiver refused the message: it is larger than the transport's maximum message
    /// size, counted as a send counts it (`Envelope::size`).
    pub const MESSAGE_TOO_LARGE: &str = "courier.MessageTooLarge";
}
