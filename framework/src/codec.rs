//! Codecs turn typed values into message bodies and back.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// An encoding of message bodies.
pub trait Codec: Send + Sync + 'static {
    /// The MIME type written into the envelope's content type.
    fn content_type(&self) -> &'static str;
    /// Whether this codec reads a body whose message says it is of `content_type` (a
    /// message without a content type is not asked about: it is decoded as the codec's).
    ///
    /// The default matches as media types are matched (RFC 9110, section 8.3.1): the
    /// type and subtype of [`content_type`](Self::content_type), compared without
    /// regard to case, with any parameters (`;` then `name=value`, the value a token or
    /// a quoted string, whitespace around `;` and `=`). A structured-syntax suffix is
    /// another subtype: `application/problem+json` is not `application/json`. A codec
    /// whose own content type is not a media type matches only that exact text.
    ///
    /// # Examples
    ///
    /// ```
    /// use courier::{Codec, JsonCodec};
    ///
    /// assert!(JsonCodec.check_content_type("Application/JSON; charset=\"UTF-8\"").is_ok());
    /// assert!(JsonCodec.check_content_type("application/json; charset=latin1").is_err());
    /// assert!(JsonCodec.check_content_type("application/problem+json").is_err());
    /// ```
    ///
    /// # Errors
    /// [`CodecError::ContentTypeMismatch`], with the reason, if this codec does not read
    /// bodies of that content type.
    fn check_content_type(&self, content_type: &str) -> Result<(), CodecError> {
        same_media_type(self.content_type(), content_type).map(|_| ())
    }
    /// Encodes a value.
    ///
    /// # Errors
    /// [`CodecError::Encode`] if the value cannot be encoded.
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Bytes, CodecError>;
    /// Decodes a body.
    ///
    /// # Errors
    /// [`CodecError::Decode`] if the bytes are not a valid `T`.
    fn decode<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T, CodecError>;
}

/// JSON through serde_json: the default codec.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonCodec;

impl Codec for JsonCodec {
    fn content_type(&self) -> &'static str {
        "application/json"
    }

    /// `application/json` as a media type (see [`Codec::check_content_type`]), with
    /// any parameters but a `charset` other than `utf-8` (any case): JSON exchanged
    /// between systems is UTF-8 (RFC 8259, section 8.1), and this codec reads nothing
    /// else.
    fn check_content_type(&self, content_type: &str) -> Result<(), CodecError> {
        let found = same_media_type(self.content_type(), content_type)?;
        if let Some(charset) = found.parameters(CHARSET).find(|v| !v.eq_ignore_ascii_case("utf-8")) {
            return Err(mismatch(
                self.content_type(),
                content_type,
                format!("JSON is UTF-8 (RFC 8259): charset {charset:?} cannot be read"),
            ));
        }
        Ok(())
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Bytes, CodecError> {
        serde_json::to_vec(value)
            .map(Bytes::from)
            .map_err(|e| CodecError::Encode(Box::new(e)))
    }

    fn decode<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T, CodecError> {
        serde_json::from_slice(body).map_err(|e| CodecError::Decode(Box::new(e)))
    }
}

/// Why a body could not be encoded or decoded. None of these is transient: the same
/// bytes fail the same way again, so a message that does not decode belongs in the
/// dead-letter queue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The value could not be encoded.
    #[error("cannot encode message body")]
    Encode(#[source] crate::error::BoxError),
    /// The body could not be decoded.
    #[error("cannot decode message body")]
    Decode(#[source] crate::error::BoxError),
    /// The message says it has another content type than this codec reads.
    #[error("content type {found:?} cannot be read by a codec for {expected:?}: {reason}")]
    ContentTypeMismatch {
        /// The codec's content type.
        expected: String,
        /// The message's content type.
        found: String,
        /// Why it cannot be read (another media type, not a media type at all, a
        /// charset the codec does not read).
        reason: String,
    },
}

/// The name of the parameter that says a text body's character set.
const CHARSET: &str = "charset";

fn mismatch(expected: &str, found: &str, reason: String) -> CodecError {
    CodecError::ContentTypeMismatch {
        expected: expected.to_owned(),
        found: found.to_owned(),
        reason,
    }
}

/// `found` parsed, if it is the media type `expected` (type and subtype, any case; any
/// parameters, left to the caller to judge). An `expected` that is not a media type
/// itself (a custom codec's) matches only its exact text.
///
/// # Errors
/// [`CodecError::ContentTypeMismatch`] saying why not.
pub(crate) fn same_media_type<'a>(expected: &str, found: &'a str) -> Result<MediaType<'a>, CodecError> {
    let Ok(want) = MediaType::parse(expected) else {
        if found == expected {
            // Nothing to judge beyond the text: no parameters.
            return Ok(MediaType {
                type_: found,
                subtype: "",
                parameters: Vec::new(),
            });
        }
        return Err(mismatch(expected, found, "it is another content type".to_owned()));
    };
    match MediaType::parse(found) {
        Ok(m) if m.is(&want) => Ok(m),
        Ok(m) => Err(mismatch(
            expected,
            found,
            format!(
                "{}/{} is another media type",
                m.type_.to_ascii_lowercase(),
                m.subtype.to_ascii_lowercase()
            ),
        )),
        Err(e) => Err(mismatch(expected, found, format!("it is not a media type: {e}"))),
    }
}

/// A media type as a content type writes it (RFC 9110, section 8.3.1):
/// `type "/" subtype *( OWS ";" OWS [ name "=" value ] )`, the value a token or a quoted
/// string. Whitespace (spaces, tabs) is also allowed around the whole and around `=`.
/// Type, subtype and parameter names compare without regard to case; parameter values
/// as written (a quoted one unescaped), each parameter's own rule saying more (a
/// charset's is case-insensitive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MediaType<'a> {
    type_: &'a str,
    subtype: &'a str,
    parameters: Vec<(&'a str, Cow<'a, str>)>,
}

/// Why a text is not a media type: what was expected, at which byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{expected} at byte {at}")]
pub(crate) struct MediaTypeError {
    expected: &'static str,
    at: usize,
}

impl<'a> MediaType<'a> {
    /// Parses `text`.
    ///
    /// # Errors
    /// [`MediaTypeError`] saying what was expected where.
    pub(crate) fn parse(text: &'a str) -> Result<Self, MediaTypeError> {
        let b = text.as_bytes();
        let fail = |expected, at| Err(MediaTypeError { expected, at });
        let mut i = skip_ows(b, 0);
        let end = token_end(b, i);
        if end == i {
            return fail("a type (a token)", i);
        }
        let type_ = &text[i..end];
        i = end;
        if b.get(i) != Some(&b'/') {
            return fail("'/' after the type", i);
        }
        i += 1;
        let end = token_end(b, i);
        if end == i {
            return fail("a subtype (a token) after '/'", i);
        }
        let subtype = &text[i..end];
        i = end;
        let mut parameters = Vec::new();
        loop {
            i = skip_ows(b, i);
            match b.get(i) {
                None => break,
                Some(b';') => {
                    i = skip_ows(b, i + 1);
                    // An empty parameter (`;;`, a trailing `;`) is allowed.
                    if matches!(b.get(i), None | Some(b';')) {
                        continue;
                    }
                    let end = token_end(b, i);
                    if end == i {
                        return fail("a parameter name (a token) after ';'", i);
                    }
                    let name = &text[i..end];
                    i = skip_ows(b, end);
                    if b.get(i) != Some(&b'=') {
                        return fail("'=' after the parameter name", i);
                    }
                    i = skip_ows(b, i + 1);
                    let value = if b.get(i) == Some(&b'"') {
                        let (value, end) = quoted_string(text, i)?;
                        i = end;
                        value
                    } else {
                        let end = token_end(b, i);
                        if end == i {
                            return fail("a parameter value (a token or a quoted string) after '='", i);
                        }
                        let value = Cow::Borrowed(&text[i..end]);
                        i = end;
                        value
                    };
                    parameters.push((name, value));
                }
                Some(_) => return fail("';' or the end", i),
            }
        }
        Ok(MediaType {
            type_,
            subtype,
            parameters,
        })
    }

    /// Whether `self` and `other` have the same type and subtype (their parameters
    /// aside).
    pub(crate) fn is(&self, other: &MediaType<'_>) -> bool {
        self.type_.eq_ignore_ascii_case(other.type_) && self.subtype.eq_ignore_ascii_case(other.subtype)
    }

    /// The values of the parameters named `name` (any case), in order.
    pub(crate) fn parameters<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s str> + 's {
        self.parameters
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }
}

/// The index of the first byte at or after `i` that is not optional whitespace (space,
/// tab).
fn skip_ows(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t')) {
        i += 1;
    }
    i
}

/// The end of the token that starts at `i` (`i` itself when there is none).
fn token_end(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| is_tchar(*c)) {
        i += 1;
    }
    i
}

/// A token's characters (RFC 9110, section 5.6.2).
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// The quoted string that starts at `start` (a `"`), unescaped, and the index after its
/// closing quote (RFC 9110, section 5.6.4: text, `\` escapes any visible character,
/// space or tab; bytes of non-ASCII characters are allowed as obs-text).
fn quoted_string(text: &str, start: usize) -> Result<(Cow<'_, str>, usize), MediaTypeError> {
    let b = text.as_bytes();
    let allowed = |c: u8| c == b'\t' || c == b' ' || (0x21..=0x7e).contains(&c) || c >= 0x80;
    let mut unescaped: Option<Vec<u8>> = None;
    let mut i = start + 1;
    loop {
        match b.get(i) {
            None => {
                return Err(MediaTypeError {
                    expected: "a closing '\"'",
                    at: i,
                });
            }
            Some(b'"') => break,
            Some(b'\\') => {
                let Some(&c) = b.get(i + 1).filter(|c| allowed(**c)) else {
                    return Err(MediaTypeError {
                        expected: "a visible character, space or tab after '\\'",
                        at: i + 1,
                    });
                };
                unescaped.get_or_insert_with(|| b[start + 1..i].to_vec()).push(c);
                i += 2;
            }
            Some(&c) if allowed(c) => {
                if let Some(u) = unescaped.as_mut() {
                    u.push(c);
                }
                i += 1;
            }
            Some(_) => {
                return Err(MediaTypeError {
                    expected: "text or a closing '\"' in a quoted string",
                    at: i,
                });
            }
        }
    }
    let value = match unescaped {
        None => Cow::Borrowed(&text[start + 1..i]),
        // Cut only at ASCII bytes, so the bytes of every character stay together.
        Some(bytes) => Cow::Owned(String::from_utf8(bytes).map_err(|_| MediaTypeError {
            expected: "UTF-8 text in a quoted string",
            at: start,
        })?),
    };
    Ok((value, i + 1))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn reason(content_type: &str) -> String {
        match JsonCodec.check_content_type(content_type) {
            Err(CodecError::ContentTypeMismatch { reason, .. }) => reason,
            other => panic!("{content_type:?} should be refused, was {other:?}"),
        }
    }

    #[test]
    fn json_is_read_with_any_case_parameters_and_whitespace() {
        for ok in [
            "application/json",
            "Application/JSON",
            "APPLICATION/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=UTF-8",
            "application/json ; charset = utf-8 ",
            " \tapplication/json\t;\tCharSet=\"Utf-8\"",
            "application/json; charset=\"utf-8\"",
            "application/json; charset=\"u\\tf-8\"",
            "application/json;",
            "application/json;;  ; charset=utf-8;",
            "application/json; version=2; q=\"a \\\"quoted\\\" ; value\"",
            "application/json; x=\"caf\u{e9}\"",
        ] {
            assert!(JsonCodec.check_content_type(ok).is_ok(), "{ok:?} is JSON");
        }
    }

    #[test]
    fn other_types_suffixes_and_malformed_texts_are_refused() {
        assert!(reason("text/plain").contains("text/plain is another media type"));
        assert!(reason("application/problem+json").contains("application/problem+json is another media type"));
        assert!(reason("application/jsonx").contains("another media type"));
        assert!(reason("text/json").contains("another media type"));
        for malformed in [
            "",
            " ",
            "application",
            "application/",
            "/json",
            "application /json",
            "application/ json",
            "application/json x",
            "application/json; charset",
            "application/json; charset=",
            "application/json; =utf-8",
            "application/json; charset=\"utf-8",
            "application/json; charset=utf 8",
            "application/json; charset=\"a\u{1}b\"",
            "application/json; charset=\"ends with a backslash\\",
            "application/json\u{0}",
            "appli\u{e9}cation/json",
        ] {
            assert!(
                reason(malformed).starts_with("it is not a media type: "),
                "{malformed:?}: {}",
                reason(malformed)
            );
        }
    }

    #[test]
    fn a_charset_other_than_utf_8_is_refused_for_json() {
        for latin in [
            "application/json; charset=latin1",
            "application/json; charset=\"ISO-8859-1\"",
            "application/json; charset=utf-16",
            "application/json; charset=utf-8; charset=latin1",
        ] {
            let why = reason(latin);
            assert!(why.starts_with("JSON is UTF-8"), "{latin:?}: {why}");
        }
        let e = JsonCodec
            .check_content_type("application/json; charset=latin1")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "content type \"application/json; charset=latin1\" cannot be read by a codec for \
             \"application/json\": JSON is UTF-8 (RFC 8259): charset \"latin1\" cannot be read"
        );
    }

    #[test]
    fn quoted_values_are_unescaped() {
        let m = MediaType::parse(r#"a/b; Name="x\"y\\z"; other=tok"#).unwrap();
        assert_eq!(m.parameters("name").collect::<Vec<_>>(), vec![r#"x"y\z"#]);
        assert_eq!(m.parameters("OTHER").collect::<Vec<_>>(), vec!["tok"]);
        assert_eq!(m.parameters("missing").count(), 0);
        assert!(matches!(m.parameters[0].1, Cow::Owned(_)));
        assert!(matches!(m.parameters[1].1, Cow::Borrowed(_)));
    }

    /// A custom codec's content type is a media type too; one that is not matches only
    /// its own text.
    #[test]
    fn the_default_check_matches_the_codecs_own_media_type() {
        struct Marked(&'static str);
        impl Codec for Marked {
            fn content_type(&self) -> &'static str {
                self.0
            }
            fn encode<T: Serialize + ?Sized>(&self, _: &T) -> Result<Bytes, CodecError> {
                Ok(Bytes::new())
            }
            fn decode<T: DeserializeOwned>(&self, _: &[u8]) -> Result<T, CodecError> {
                Err(CodecError::Decode("never".into()))
            }
        }
        let marked = Marked("application/x-marked");
        assert!(
            marked
                .check_content_type("Application/X-Marked; charset=latin1")
                .is_ok()
        );
        assert!(marked.check_content_type("application/json").is_err());
        let odd = Marked("not a media type");
        assert!(odd.check_content_type("not a media type").is_ok());
        assert!(odd.check_content_type("Not a media type").is_err());
    }

    /// `text` with each ASCII letter in upper or lower case as `upper` says.
    fn recase(text: &str, upper: &[bool]) -> String {
        text.chars()
            .enumerate()
            .map(|(i, c)| {
                if upper.get(i).copied().unwrap_or(false) {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    }

    /// Optional whitespace: spaces and tabs.
    fn ows() -> impl Strategy<Value = String> {
        "[ \t]{0,3}"
    }

    /// A parameter other than a charset: a token, or a quoted string of any text (its
    /// quotes and backslashes escaped).
    fn other_parameter() -> impl Strategy<Value = String> {
        let value = prop_oneof![
            "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}",
            "[ -~\u{80}-\u{10ffff}]{0,16}".prop_map(|v| {
                let escaped: String = v
                    .chars()
                    .flat_map(|c| match c {
                        '"' | '\\' => vec!['\\', c],
                        c => vec![c],
                    })
                    .collect();
                format!("\"{escaped}\"")
            }),
        ];
        ("(version|q|boundary|x-[a-z]{1,5})", ows(), ows(), value)
            .prop_map(|(name, before, after, value)| format!("{name}{before}={after}{value}"))
    }

    /// A charset parameter of `value` in any case, bare or quoted.
    fn charset(value: &'static str) -> impl Strategy<Value = String> {
        (
            proptest::collection::vec(any::<bool>(), 16),
            proptest::collection::vec(any::<bool>(), 16),
            any::<bool>(),
            ows(),
            ows(),
        )
            .prop_map(move |(name_case, value_case, quoted, before, after)| {
                let value = recase(value, &value_case);
                let value = if quoted { format!("\"{value}\"") } else { value };
                format!("{}{before}={after}{value}", recase(CHARSET, &name_case))
            })
    }

    /// `application/json` in any case with whitespace around it and around its
    /// parameters, which are `parameters` in order.
    fn json_with(parameters: impl Strategy<Value = Vec<String>>) -> impl Strategy<Value = String> {
        (
            proptest::collection::vec(any::<bool>(), 16),
            ows(),
            ows(),
            parameters,
            proptest::collection::vec((ows(), ows()), 8),
        )
            .prop_map(|(case, lead, trail, parameters, spaces)| {
                let mut text = format!("{lead}{}", recase("application/json", &case));
                for (p, (before, after)) in parameters.iter().zip(spaces.iter()) {
                    text.push_str(&format!("{before};{after}{p}"));
                }
                text.push_str(&trail);
                text
            })
    }

    /// Text near a content type, and anything else.
    fn any_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[ -~]{0,40}",
            "[ \t]{0,2}[a-zA-Z+/;=\" \t\\\\-]{0,40}",
            "(application|text|Application)/(json|JSON|plain|problem\\+json)([ \t]*;[ \t]*[a-zA-Z]{0,8}[ \t]*=?[ \t]*(\"[^\"]{0,6}\"?|[a-z0-9-]{0,6})){0,3}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz::cases()))]

        /// Any text: read as JSON or refused with a reason, never a panic; what parses
        /// is made of the text's own type and subtype.
        #[test]
        fn any_content_type_is_read_or_refused_with_a_reason(text in any_text()) {
            match JsonCodec.check_content_type(&text) {
                Ok(()) => {
                    let m = MediaType::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(m.type_.eq_ignore_ascii_case("application"));
                    prop_assert!(m.subtype.eq_ignore_ascii_case("json"));
                }
                Err(CodecError::ContentTypeMismatch { reason, found, .. }) => {
                    prop_assert!(!reason.is_empty());
                    prop_assert_eq!(found, text);
                }
                Err(other) => prop_assert!(false, "unexpected error {:?}", other),
            }
        }

        /// `application/json` in any case, with whitespace anywhere it may be, with or
        /// without a UTF-8 charset among other parameters: always read.
        #[test]
        fn json_in_any_case_and_spacing_is_read(
            text in json_with(
                (proptest::collection::vec(other_parameter(), 0..3), proptest::option::of(charset("utf-8")), 0..4usize)
                    .prop_map(|(mut others, charset, at)| {
                        if let Some(c) = charset {
                            others.insert(at.min(others.len()), c);
                        }
                        others
                    })
            )
        ) {
            prop_assert!(JsonCodec.check_content_type(&text).is_ok(), "{:?}: {:?}", text, JsonCodec.check_content_type(&text));
        }

        /// The same with a charset other than UTF-8: refused, and the reason says JSON
        /// is UTF-8.
        #[test]
        fn json_in_another_charset_is_refused(
            text in json_with(
                (proptest::collection::vec(other_parameter(), 0..3), prop_oneof![charset("latin1"), charset("iso-8859-1"), charset("utf-16"), charset("us-ascii")])
                    .prop_map(|(mut others, charset)| {
                        others.push(charset);
                        others
                    })
            )
        ) {
            match JsonCodec.check_content_type(&text) {
                Err(CodecError::ContentTypeMismatch { reason, .. }) => prop_assert!(reason.starts_with("JSON is UTF-8"), "{}", reason),
                other => prop_assert!(false, "{:?} was {:?}", text, other),
            }
        }
    }
}
