//! Tests of Courier's macros, `#[derive(courier::Message)]`, `#[courier::handler]` and
//! `#[courier::saga]`:
//! what they accept and the errors they report (trybuild UI tests under `ui/`), and what
//! the impls they generate return at run time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use courier::{Codec, CodecError, Envelope, Handler, HandlerError, Message};
use serde::{Deserialize, Serialize};

/// Every program under `ui/pass` compiles; every program under `ui/fail` fails with the
/// errors of its `.stderr` snapshot (`TRYBUILD=overwrite` regenerates them).
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}

/// A message with the default wire name.
#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
struct Defaulted {
    n: u32,
}

/// A message with a pinned wire name and earlier names.
#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "billing.InvoicePaid", aliases = ["billing.InvoiceSettled", "InvoicePaid"])]
struct Pinned {
    invoice: String,
}

mod nested {
    /// A message in a nested module: the module is part of its default name.
    #[derive(serde::Serialize, serde::Deserialize, courier::Message)]
    pub(crate) struct Inner;
}

/// A codec that is not JSON: the body is the JSON text behind a marker, so a test can
/// tell which codec wrote it.
#[derive(Debug, Default)]
struct MarkedCodec;

const MARK: &[u8] = b"marked:";

impl Codec for MarkedCodec {
    fn content_type(&self) -> &'static str {
        "application/x-marked"
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<bytes::Bytes, CodecError> {
        let mut body = MARK.to_vec();
        serde_json::to_writer(&mut body, value).map_err(|e| CodecError::Encode(Box::new(e)))?;
        Ok(body.into())
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, body: &[u8]) -> Result<T, CodecError> {
        let json = body
            .strip_prefix(MARK)
            .ok_or_else(|| CodecError::Decode("no marker".into()))?;
        serde_json::from_slice(json).map_err(|e| CodecError::Decode(Box::new(e)))
    }
}

/// A message encoded with [`MarkedCodec`].
#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "marked.Thing", codec = MarkedCodec)]
struct Marked {
    n: u32,
}

/// A handler in this module.
#[courier::handler]
async fn on_defaulted(_msg: Defaulted, _ctx: &mut courier::Context) -> Result<(), HandlerError> {
    Ok(())
}

#[test]
fn default_name_is_module_path_and_type_name() {
    assert_eq!(<Defaulted as Message>::NAME, "macros::Defaulted");
    assert_eq!(<Defaulted as Message>::NAME, concat!(module_path!(), "::Defaulted"));
    assert_eq!(<nested::Inner as Message>::NAME, "macros::nested::Inner");
    assert!(<Defaulted as Message>::ALIASES.is_empty());
}

#[test]
fn pinned_name_and_aliases() {
    assert_eq!(<Pinned as Message>::NAME, "billing.InvoicePaid");
    assert_eq!(<Pinned as Message>::ALIASES, ["billing.InvoiceSettled", "InvoicePaid"]);
}

#[test]
fn default_codec_is_json_with_the_wire_name() {
    let envelope = Defaulted { n: 7 }.to_envelope().unwrap();
    assert_eq!(envelope.message_type.as_deref(), Some("macros::Defaulted"));
    assert_eq!(envelope.content_type.as_deref(), Some("application/json"));
    assert_eq!(&envelope.body[..], br#"{"n":7}"#);
    assert_eq!(Defaulted::from_envelope(&envelope).unwrap(), Defaulted { n: 7 });

    let pinned = Pinned {
        invoice: "A-1".to_owned(),
    };
    let envelope = pinned.to_envelope().unwrap();
    assert_eq!(envelope.message_type.as_deref(), Some("billing.InvoicePaid"));
    assert_eq!(Pinned::from_envelope(&envelope).unwrap(), pinned);
}

#[test]
fn custom_codec_is_used_both_ways() {
    let envelope = Marked { n: 3 }.to_envelope().unwrap();
    assert_eq!(envelope.message_type.as_deref(), Some("marked.Thing"));
    assert_eq!(envelope.content_type.as_deref(), Some("application/x-marked"));
    assert_eq!(&envelope.body[..], br#"marked:{"n":3}"#);
    assert_eq!(Marked::from_envelope(&envelope).unwrap(), Marked { n: 3 });

    // A JSON body is not read by the marked codec: its content type does not match.
    let json = Envelope::json(&Marked { n: 3 }).unwrap();
    assert!(matches!(
        Marked::from_envelope(&json),
        Err(CodecError::ContentTypeMismatch { .. })
    ));
    // Without a content type, the codec itself rejects a body it did not write.
    let mut bare = json;
    bare.content_type = None;
    assert!(matches!(Marked::from_envelope(&bare), Err(CodecError::Decode(_))));
}

/// A message at version 3 in the marked codec, with an upcaster of its own.
#[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "marked.Versioned", codec = MarkedCodec, version = 3, upcast = Self::upcast)]
struct Versioned {
    n: u32,
}

impl Versioned {
    fn upcast(from: u32, mut body: serde_json::Value) -> Result<serde_json::Value, courier::UpcastError> {
        match from {
            2 => {
                body["n"] = body["count"].take();
                Ok(body)
            }
            _ => Err(courier::UpcastError::unsupported(from)),
        }
    }
}

#[test]
fn a_version_above_one_is_stamped_and_its_upcaster_generated() {
    use courier::version::headers::MESSAGE_VERSION;
    assert_eq!(<Versioned as Message>::VERSION, 3);
    assert_eq!(<Defaulted as Message>::VERSION, 1, "the default");
    let envelope = Versioned { n: 4 }.to_envelope().unwrap();
    assert_eq!(
        envelope.properties.get(MESSAGE_VERSION),
        Some(&courier::PropertyValue::Int(3))
    );
    assert_eq!(&envelope.body[..], br#"marked:{"n":4}"#, "the codec's own encoding");
    let unversioned = Defaulted { n: 1 }.to_envelope().unwrap();
    assert!(
        !unversioned.properties.contains_key(MESSAGE_VERSION),
        "version 1 is not stamped"
    );

    // An older body is read with the message's codec, then upcast.
    let old = Envelope::new(&b"marked:{\"count\":9}"[..]).with_content_type("application/x-marked");
    let value = Versioned::body_value(&old).unwrap();
    assert_eq!(value, serde_json::json!({"count": 9}));
    let upcast = Versioned::upcast(2, value).unwrap();
    assert_eq!(upcast["n"], 9);
    assert!(matches!(
        Versioned::upcast(1, serde_json::json!({})),
        Err(courier::UpcastError::Unsupported { from: 1 })
    ));
    assert!(
        matches!(
            Defaulted::upcast(1, serde_json::json!({})),
            Err(courier::UpcastError::Unsupported { from: 1 }),
        ),
        "no upcaster: none from any version"
    );
}

#[test]
fn generated_handler_is_a_unit_struct_named_by_its_path() {
    fn message_of<H: Handler>(_: &H) -> &'static str {
        <H::Message as Message>::NAME
    }
    fn made_by_default<T: Default + Copy + std::fmt::Debug>() -> T {
        T::default()
    }
    assert_eq!(on_defaulted.name(), "macros::on_defaulted");
    // The struct is `Copy + Default + Debug`, and handles the message of its first argument.
    let h: on_defaulted = made_by_default();
    assert_eq!(format!("{h:?}"), "on_defaulted");
    assert_eq!(message_of(&h), "macros::Defaulted");
}

/// A saga named by default, and one with a pinned name.
#[derive(Default, Serialize, Deserialize)]
struct Onboarding;

#[courier::saga]
impl Onboarding {
    #[start(by = n)]
    async fn begin(&mut self, _msg: Defaulted) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[derive(Default, Serialize, Deserialize)]
struct SignUp;

#[courier::saga(name = "accounts.SignUp")]
impl SignUp {
    #[start(header = "x-user-id")]
    async fn begin(&mut self, _msg: Pinned) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[test]
fn saga_name_is_module_path_and_type_name_unless_pinned() {
    use courier::saga::Saga;
    assert_eq!(Onboarding::NAME, "macros::Onboarding");
    assert_eq!(SignUp::NAME, "accounts.SignUp");
}
