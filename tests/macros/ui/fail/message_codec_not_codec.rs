//! The codec of a message implements `courier::Codec` and `Default`.

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(codec = String)]
struct Tick;

mod codecs {
    /// A codec without a `Default`.
    pub struct NoDefault;

    impl courier::Codec for NoDefault {
        fn content_type(&self) -> &'static str {
            "application/x-none"
        }
        fn encode<T: serde::Serialize + ?Sized>(&self, _: &T) -> Result<bytes::Bytes, courier::CodecError> {
            Ok(bytes::Bytes::new())
        }
        fn decode<T: serde::de::DeserializeOwned>(&self, _: &[u8]) -> Result<T, courier::CodecError> {
            Err(courier::CodecError::Decode("none".into()))
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(codec = codecs::NoDefault)]
struct Tock;

fn main() {}
