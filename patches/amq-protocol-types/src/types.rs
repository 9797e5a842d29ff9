use crate::value::AMQPValue;

use std::{
    borrow,
    collections::{BTreeMap, btree_map},
    fmt, str,
};

use serde::{Deserialize, Serialize};

/// Enumeration referencing all the available AMQP types
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum AMQPType {
    /// A bool
    Boolean,
    /// An i8
    ShortShortInt,
    /// A u8
    ShortShortUInt,
    /// An i16
    ShortInt,
    /// A u16
    ShortUInt,
    /// An i32
    LongInt,
    /// A u32
    LongUInt,
    /// An i64
    LongLongInt,
    /// A u64
    LongLongUInt,
    /// An f32
    Float,
    /// An f64
    Double,
    /// A decimal value represented by a scale and a value
    DecimalValue,
    /// Deprecated, a String
    ShortString,
    /// A String
    LongString,
    /// An array of AMQPValue
    FieldArray,
    /// A timestamp (u64)
    Timestamp,
    /// A Map<String, AMQPValue>
    FieldTable,
    /// An array of bytes, RabbitMQ specific
    ByteArray, /* ByteArray is specific to RabbitMQ */
    /// No value
    Void,
}

impl AMQPType {
    /// Get the AMQPType corresponding to the given id.
    /// We don't strictly follow the spec here but rather the RabbitMQ implementation
    /// 's' means ShortInt (like 'U') instead of ShortString
    /// 'l' and 'L' both mean LongLongInt (no LongLongUInt)
    #[must_use]
    pub fn from_id(id: char) -> Option<AMQPType> {
        match id {
            't' => Some(AMQPType::Boolean),
            'b' => Some(AMQPType::ShortShortInt),
            'B' => Some(AMQPType::ShortShortUInt),
            /* Specs says 'U', RabbitMQ says 's' (which means ShortString in specs) */
            's' | 'U' => Some(AMQPType::ShortInt),
            'u' => Some(AMQPType::ShortUInt),
            'I' => Some(AMQPType::LongInt),
            'i' => Some(AMQPType::LongUInt),
            /* RabbitMQ treats both 'l' and 'L' as LongLongInt and ignores LongLongUInt */
            'L' | 'l' => Some(AMQPType::LongLongInt),
            'f' => Some(AMQPType::Float),
            'd' => Some(AMQPType::Double),
            'D' => Some(AMQPType::DecimalValue),
            'S' => Some(AMQPType::LongString),
            'A' => Some(AMQPType::FieldArray),
            'T' => Some(AMQPType::Timestamp),
            'F' => Some(AMQPType::FieldTable),
            'x' => Some(AMQPType::ByteArray),
            'V' => Some(AMQPType::Void),
            _ => None,
        }
    }

    /// Get the id from an AMQPType
    /// We don't strictly follow the spec here but rather the RabbitMQ implementation
    /// ShortString doesn't have an id, we return '_' instead
    /// ShortInt is supposed to be 'U' but we use 's'
    /// LongLongUInt is supposed to be 'L' but we return 'l' as LongLongInt
    #[must_use]
    pub fn get_id(self) -> char {
        match self {
            AMQPType::Boolean => 't',
            AMQPType::ShortShortInt => 'b',
            AMQPType::ShortShortUInt => 'B',
            /* Specs says 'U', RabbitMQ says 's' (which means ShortString in specs) */
            AMQPType::ShortInt => 's',
            AMQPType::ShortUInt => 'u',
            AMQPType::LongInt => 'I',
            AMQPType::LongUInt => 'i',
            /* RabbitMQ treats both 'l' and 'L' as LongLongInt and ignores LongLongUInt */
            AMQPType::LongLongInt | AMQPType::LongLongUInt => 'l',
            AMQPType::Float => 'f',
            AMQPType::Double => 'd',
            AMQPType::DecimalValue => 'D',
            /* ShortString only exists for internal usage, we shouldn't ever have to use this */
            AMQPType::ShortString => '_',
            AMQPType::LongString => 'S',
            AMQPType::FieldArray => 'A',
            AMQPType::Timestamp => 'T',
            AMQPType::FieldTable => 'F',
            AMQPType::ByteArray => 'x',
            AMQPType::Void => 'V',
        }
    }
}

impl fmt::Display for AMQPType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_fmt(format_args!("{self:?}"))
    }
}

/// AMQP boolean (`t`): a single true/false value.
pub type Boolean = bool;
/// AMQP short-short-int (`b`): a signed 8-bit integer.
pub type ShortShortInt = i8;
/// AMQP short-short-uint (`B`): an unsigned 8-bit integer.
pub type ShortShortUInt = u8;
/// AMQP short-int (`U`): a signed 16-bit integer.
pub type ShortInt = i16;
/// AMQP short-uint (`u`): an unsigned 16-bit integer.
pub type ShortUInt = u16;
/// AMQP long-int (`I`): a signed 32-bit integer.
pub type LongInt = i32;
/// AMQP long-uint (`i`): an unsigned 32-bit integer.
pub type LongUInt = u32;
/// AMQP long-long-int (`L`): a signed 64-bit integer.
pub type LongLongInt = i64;
/// AMQP long-long-uint (`l`): an unsigned 64-bit integer.
pub type LongLongUInt = u64;
/// AMQP float (`f`): a 32-bit IEEE 754 floating-point value.
pub type Float = f32;
/// AMQP double (`d`): a 64-bit IEEE 754 floating-point value.
pub type Double = f64;
/// AMQP timestamp (`T`): a 64-bit POSIX timestamp (seconds since the Unix epoch).
pub type Timestamp = LongLongUInt;
/// AMQP void: the absence of a value, equivalent to `()`.
pub type Void = ();

/// Maximum byte length of a [ShortString]
pub const MAX_SHORT_STRING_LENGTH: usize = ShortShortUInt::MAX as usize;

/// Error returned when constructing a [ShortString] from a string that exceeds [MAX_SHORT_STRING_LENGTH]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShortStringError(usize);

impl fmt::Display for ShortStringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ShortString exceeds maximum length of {MAX_SHORT_STRING_LENGTH} bytes (got {})",
            self.0
        )
    }
}

impl std::error::Error for ShortStringError {}

/// A String (deprecated)
// COURIER PATCH (see PATCH.md): a second field keeps the bytes received when they were
// not UTF-8. Equality, order, hashing and serde look at the text only, as before.
#[derive(Clone, Debug, Default)]
pub struct ShortString(String, Option<Box<[u8]>>);
/// A String
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
pub struct LongString(Vec<u8>);
/// An array of AMQPValue
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct FieldArray(Vec<AMQPValue>);
/// A Map<String, AMQPValue>
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct FieldTable(BTreeMap<ShortString, AMQPValue>);
/// An array of bytes (RabbitMQ specific)
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
pub struct ByteArray(Vec<u8>);

/// A Decimal value composed of a scale and a value
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
pub struct DecimalValue {
    /// The scale of the value
    pub scale: ShortShortUInt,
    /// The actual value
    pub value: LongUInt,
}

impl ShortString {
    /// Get a reference to a ShortString as &str
    #[must_use]
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// Fallibly construct a [ShortString], returning an error if the string exceeds [MAX_SHORT_STRING_LENGTH] bytes
    pub fn try_new(s: impl Into<String>) -> Result<Self, ShortStringError> {
        let s = s.into();
        if s.len() > MAX_SHORT_STRING_LENGTH {
            return Err(ShortStringError(s.len()));
        }
        Ok(Self(s, None))
    }

    // COURIER PATCH (see PATCH.md): begin
    /// A short string as received from the wire. Bytes that are not UTF-8 do not fail the
    /// parse of the frame (which would close the whole connection): the text is then the
    /// lossy UTF-8 reading, cut to [MAX_SHORT_STRING_LENGTH] bytes at a character
    /// boundary, and the bytes received are kept ([ShortString::invalid_utf8]).
    #[must_use]
    pub fn from_received_bytes(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(s) => Self(s, None),
            Err(e) => {
                let raw = e.into_bytes();
                let mut text = String::from_utf8_lossy(&raw).into_owned();
                let mut end = text.len().min(MAX_SHORT_STRING_LENGTH);
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                Self(text, Some(raw.into_boxed_slice()))
            }
        }
    }

    /// The bytes received for this string when they were not valid UTF-8 (its text is
    /// then a lossy reading of them); `None` for every valid string.
    #[must_use]
    pub fn invalid_utf8(&self) -> Option<&[u8]> {
        self.1.as_deref()
    }
}

// Two strings received as different bytes are different, even when their lossy texts are
// the same: two header names must not become one entry of a table, nor two message ids one.
// Hashing looks at the text only (equal strings have equal texts), so a lookup by `&str`
// through `Borrow` finds a string whose text it is.
impl PartialEq for ShortString {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0 && self.1 == other.1
    }
}

impl Eq for ShortString {}

impl PartialOrd for ShortString {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ShortString {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0).then_with(|| self.1.cmp(&other.1))
    }
}

impl std::hash::Hash for ShortString {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

/// The serde form of a [ShortString], as the derive of `ShortString(String)` made it.
#[derive(Deserialize, Serialize)]
#[serde(rename = "ShortString")]
struct ShortStringText(String);

impl Serialize for ShortString {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_newtype_struct("ShortString", &self.0)
    }
}

impl<'de> Deserialize<'de> for ShortString {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ShortStringText::deserialize(deserializer).map(|ShortStringText(s)| Self(s, None))
    }
}
// COURIER PATCH: end

impl From<String> for ShortString {
    fn from(s: String) -> Self {
        Self::try_new(s).expect("ShortString exceeds maximum length")
    }
}

impl From<&str> for ShortString {
    fn from(s: &str) -> Self {
        Self::try_new(s).expect("ShortString exceeds maximum length")
    }
}

impl borrow::Borrow<str> for ShortString {
    fn borrow(&self) -> &str {
        self.0.borrow()
    }
}

impl fmt::Display for ShortString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<ShortString> for String {
    fn from(value: ShortString) -> Self {
        value.0
    }
}

impl LongString {
    /// Get a reference to a LongString as &[u8]
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0[..]
    }

    /// Get the length of the inner bytes array
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Check whether the inner bytes array is empty or not
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<B> From<B> for LongString
where
    B: Into<Vec<u8>>,
{
    fn from(bytes: B) -> Self {
        Self(bytes.into())
    }
}

impl fmt::Display for LongString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        String::from_utf8_lossy(&self.0).fmt(f)
    }
}

impl FieldArray {
    /// Get the inner values as a slice
    #[must_use]
    pub fn as_slice(&self) -> &[AMQPValue] {
        self.0.as_slice()
    }

    /// Add an item to the array
    pub fn push(&mut self, v: AMQPValue) {
        self.0.push(v);
    }
}

impl From<Vec<AMQPValue>> for FieldArray {
    fn from(v: Vec<AMQPValue>) -> Self {
        Self(v)
    }
}

impl FieldTable {
    /// Insert a new entry in the table
    pub fn insert(&mut self, k: ShortString, v: AMQPValue) -> &mut Self {
        self.0.insert(k, v);
        self
    }

    /// Check whether the table contains the given key
    #[must_use]
    pub fn contains_key(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }

    /// Access the inner BTreeMap to perform lookups
    #[must_use]
    pub fn inner(&self) -> &BTreeMap<ShortString, AMQPValue> {
        &self.0
    }
}

impl<'a> IntoIterator for &'a FieldTable {
    type Item = (&'a ShortString, &'a AMQPValue);
    type IntoIter = btree_map::Iter<'a, ShortString, AMQPValue>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl From<BTreeMap<ShortString, AMQPValue>> for FieldTable {
    fn from(m: BTreeMap<ShortString, AMQPValue>) -> Self {
        Self(m)
    }
}

impl ByteArray {
    /// Get the inner bytes array as slice
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        self.0.as_slice()
    }

    /// Get the length of the inner bytes array
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Check whether the ByteArray is empty
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<u8>> for ByteArray {
    fn from(v: Vec<u8>) -> Self {
        Self(v)
    }
}

impl From<&[u8]> for ByteArray {
    fn from(v: &[u8]) -> Self {
        Self(v.to_vec())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_type_from_id() {
        assert_eq!(AMQPType::from_id('T'), Some(AMQPType::Timestamp));
        assert_eq!(AMQPType::from_id('S'), Some(AMQPType::LongString));
        assert_eq!(AMQPType::from_id('s'), Some(AMQPType::ShortInt));
        assert_eq!(AMQPType::from_id('U'), Some(AMQPType::ShortInt));
        assert_eq!(AMQPType::from_id('l'), Some(AMQPType::LongLongInt));
        assert_eq!(AMQPType::from_id('z'), None);
    }

    #[test]
    fn test_type_get_id() {
        assert_eq!(AMQPType::LongLongInt.get_id(), 'l');
        assert_eq!(AMQPType::LongLongUInt.get_id(), 'l');
        assert_eq!(AMQPType::ShortString.get_id(), '_');
    }

    #[test]
    fn test_type_to_string() {
        assert_eq!(AMQPType::Boolean.to_string(), "Boolean");
        assert_eq!(AMQPType::Void.to_string(), "Void");
    }

    #[test]
    fn long_string_ergonomics() {
        let str_ref = "string ref";
        let str_owned = "string owned".to_owned();
        let vec = b"bytes".to_vec();
        let array = b"bytes".to_owned();
        let slice = &b"bytes"[..];

        let from_str_ref: LongString = str_ref.into();
        let from_str_owned: LongString = str_owned.clone().into();
        let from_vec: LongString = vec.clone().into();
        let from_array: LongString = array.into();
        let from_slice: LongString = slice.into();

        for (left, right) in [
            (str_ref.as_bytes(), from_str_ref.as_bytes()),
            (str_owned.as_bytes(), from_str_owned.as_bytes()),
            (vec.as_ref(), from_vec.as_bytes()),
            (array.as_ref(), from_array.as_bytes()),
            (slice, from_slice.as_bytes()),
        ] {
            assert_eq!(left, right);
        }
    }

    #[test]
    fn short_string_length_limit() {
        assert!(ShortString::try_new("ok").is_ok());
        assert!(ShortString::try_new("a".repeat(255)).is_ok());
        assert_eq!(
            ShortString::try_new("a".repeat(256)),
            Err(ShortStringError(256))
        );
    }
}
