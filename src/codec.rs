//! Codecs: how a payload becomes a body and back.
//!
//! A [`Codec`] is a trait object so that it can be chosen at run time and set on a connection,
//! a publisher or a consumer. It works on `serde_json::Value`, the common shape every serde
//! payload passes through; [`Message::encode`](crate::Message::encode) and
//! [`Message::decode`](crate::Message::decode) give the typed front.
//!
//! # Bytes
//!
//! A byte payload never goes through `serde_json::Value` when the codec has a **bytes fast
//! path** ([`Codec::encodes_bytes`]): a `Vec<u8>`, a byte slice or a string given to
//! [`Message::encode`](crate::Message::encode) is captured as bytes (a 16 MiB `Vec<u8>` is not
//! turned into sixteen million JSON numbers) and handed to [`Codec::encode_bytes`]; decoding
//! reads [`Codec::decode_bytes`] and builds the `Vec<u8>` straight from it. [`BytesCodec`] has
//! the fast path, and so does a [`ClaimCheckCodec`](crate::patterns::claim_check::ClaimCheckCodec) over it.
//! The result is the same bytes as the `Value` path gave; a codec without the fast path (all
//! existing implementations: the new methods have defaults) is used exactly as before.

use std::borrow::Cow;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::{BoxError, Error, Result};

/// Turns payloads into bodies with a content type, and bodies back into payloads.
pub trait Codec: Send + Sync + fmt::Debug {
    /// The content type written on messages this codec encodes.
    fn content_type(&self) -> &str;
    /// Encodes a payload.
    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError>;
    /// Decodes a body.
    fn decode(&self, body: &[u8]) -> Result<Value, BoxError>;

    /// True when this codec has a bytes fast path: [`encode_bytes`](Self::encode_bytes) and
    /// [`decode_bytes`](Self::decode_bytes) then carry a byte payload without building a
    /// `serde_json::Value`. Defaults to false.
    fn encodes_bytes(&self) -> bool {
        false
    }

    /// Encodes a byte payload (a `Vec<u8>`, a byte slice, or a string's UTF-8 bytes). Called
    /// only when [`encodes_bytes`](Self::encodes_bytes) is true. Defaults to
    /// [`encode`](Self::encode) of the bytes as a JSON array of numbers.
    fn encode_bytes(&self, bytes: Vec<u8>) -> Result<Vec<u8>, BoxError> {
        self.encode(&Value::Array(bytes.into_iter().map(Value::from).collect()))
    }

    /// Decodes a body into the byte payload it carries. Called only when
    /// [`encodes_bytes`](Self::encodes_bytes) is true. Defaults to [`decode`](Self::decode)
    /// read as an array of numbers 0–255.
    fn decode_bytes<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, [u8]>, BoxError> {
        let value = self.decode(body)?;
        Ok(Cow::Owned(serde_json::from_value::<Vec<u8>>(value)?))
    }

    /// True when this codec reads a message whose sender wrote `content_type` (`None`: the
    /// sender set none), for picking a codec by content type
    /// ([`CompositeCodec`](crate::codecs::CompositeCodec)). Defaults to: the same media type
    /// as [`content_type`](Self::content_type), case and parameters ignored; never `None`.
    fn accepts(&self, content_type: Option<&str>) -> bool {
        content_type.is_some_and(|ct| same_media_type(ct, self.content_type()))
    }

    /// Decodes a body its sender said was `content_type` (`None`: not said). Defaults to
    /// [`decode`](Self::decode); a codec that chooses by content type overrides it.
    /// [`Message::decode`](crate::Message::decode) and
    /// [`Message::payload`](crate::Message::payload) call this with the message's content type.
    fn decode_typed(&self, body: &[u8], content_type: Option<&str>) -> Result<Value, BoxError> {
        let _ = content_type;
        self.decode(body)
    }
}

/// The media type of a content type: lower case, without parameters (`; charset=…`).
pub(crate) fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn same_media_type(a: &str, b: &str) -> bool {
    media_type(a) == media_type(b)
}

/// JSON through serde (`application/json`). The default codec.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonCodec;

impl Codec for JsonCodec {
    fn content_type(&self) -> &str {
        "application/json"
    }
    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }
    fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
        Ok(serde_json::from_slice(body)?)
    }
    /// `application/json*`, `text/json*`, any `+json` type, and no content type at all (JSON
    /// is the family's default: Python `codec.py`).
    fn accepts(&self, content_type: Option<&str>) -> bool {
        match content_type.filter(|ct| !ct.is_empty()) {
            None => true,
            Some(ct) => {
                let ct = ct.to_ascii_lowercase();
                ct.starts_with("application/json")
                    || ct.starts_with("text/json")
                    || ct.contains("+json")
            }
        }
    }
}

/// Bytes as they are (`application/octet-stream`).
///
/// Encodes a string (its UTF-8 bytes) or an array of numbers 0–255 (a `Vec<u8>` through serde);
/// decodes to an array of numbers, so `Vec<u8>` round-trips. Anything else is refused.
#[derive(Clone, Copy, Debug, Default)]
pub struct BytesCodec;

impl Codec for BytesCodec {
    fn content_type(&self) -> &str {
        "application/octet-stream"
    }
    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
        match value {
            Value::String(s) => Ok(s.as_bytes().to_vec()),
            Value::Array(items) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| u8::try_from(n).ok())
                        .ok_or_else(|| BoxError::from("BytesCodec: array items must be 0-255"))
                })
                .collect(),
            _ => Err("BytesCodec encodes only strings and byte arrays".into()),
        }
    }
    fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
        Ok(Value::Array(body.iter().map(|b| Value::from(*b)).collect()))
    }
    fn encodes_bytes(&self) -> bool {
        true
    }
    fn encode_bytes(&self, bytes: Vec<u8>) -> Result<Vec<u8>, BoxError> {
        Ok(bytes)
    }
    fn decode_bytes<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, [u8]>, BoxError> {
        Ok(Cow::Borrowed(body))
    }
    /// Every content type (and none): put it last in a
    /// [`CompositeCodec`](crate::codecs::CompositeCodec).
    fn accepts(&self, _content_type: Option<&str>) -> bool {
        true
    }
}

pub(crate) fn encode_with<T: Serialize + ?Sized>(codec: &dyn Codec, value: &T) -> Result<Vec<u8>> {
    let err = |source: BoxError| Error::Codec {
        content_type: codec.content_type().to_string(),
        source,
    };
    if codec.encodes_bytes() {
        if let Some(bytes) = bytes::capture(value) {
            return codec.encode_bytes(bytes).map_err(err);
        }
    }
    let value = serde_json::to_value(value).map_err(|e| err(e.into()))?;
    codec.encode(&value).map_err(err)
}

pub(crate) fn decode_with<T: DeserializeOwned>(codec: &dyn Codec, body: &[u8]) -> Result<T> {
    decode_typed_with(codec, body, None)
}

/// [`decode_with`] for a body whose sender said it was `content_type`.
pub(crate) fn decode_typed_with<T: DeserializeOwned>(
    codec: &dyn Codec,
    body: &[u8],
    content_type: Option<&str>,
) -> Result<T> {
    let err = |source: BoxError| Error::Codec {
        content_type: codec.content_type().to_string(),
        source,
    };
    if codec.encodes_bytes() {
        let bytes = codec.decode_bytes(body).map_err(err)?;
        // The same numbers the `Value` path hands over, without building a `Value` per byte.
        let seq = serde::de::value::SeqDeserializer::<_, serde::de::value::Error>::new(
            bytes.iter().copied(),
        );
        return T::deserialize(seq).map_err(|e| err(e.into()));
    }
    let value = codec.decode_typed(body, content_type).map_err(err)?;
    serde_json::from_value(value).map_err(|e| err(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Order {
        id: String,
        qty: u32,
    }

    #[test]
    fn json_round_trip() {
        let o = Order {
            id: "o-1".into(),
            qty: 3,
        };
        let bytes = encode_with(&JsonCodec, &o).unwrap();
        assert_eq!(bytes, br#"{"id":"o-1","qty":3}"#);
        assert_eq!(decode_with::<Order>(&JsonCodec, &bytes).unwrap(), o);
    }

    /// Found by the `acknowledged_item` fuzz target: without correctly rounded float parsing,
    /// `101e99` read as a double one bit off the nearest, so decoding what was encoded from it
    /// gave another number, and a payload passed on (a pipeline step, a copy) changed.
    #[test]
    fn a_json_number_survives_decode_encode_decode() {
        for text in [
            "101e99",
            "0.1",
            "1.7976931348623157e308",
            "5e-324",
            "2.2250738585072011e-308",
        ] {
            let v = JsonCodec.decode(text.as_bytes()).unwrap();
            let again = JsonCodec.decode(&JsonCodec.encode(&v).unwrap()).unwrap();
            assert_eq!(again, v, "{text}");
            let parsed: f64 = text.parse().unwrap();
            assert_eq!(
                v.as_f64(),
                Some(parsed),
                "{text} reads as the nearest double"
            );
        }
    }

    #[test]
    fn json_decode_error_names_content_type() {
        let e = decode_with::<Order>(&JsonCodec, b"not json").unwrap_err();
        assert!(e.to_string().contains("application/json"), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn bytes_round_trip() {
        let raw: Vec<u8> = vec![0, 1, 255];
        let bytes = encode_with(&BytesCodec, &raw).unwrap();
        assert_eq!(bytes, raw);
        assert_eq!(decode_with::<Vec<u8>>(&BytesCodec, &bytes).unwrap(), raw);
        assert_eq!(encode_with(&BytesCodec, "hé").unwrap(), "hé".as_bytes());
        assert!(encode_with(
            &BytesCodec,
            &Order {
                id: "x".into(),
                qty: 1
            }
        )
        .is_err());
    }

    /// A codec without the fast path: every payload goes through `Value`.
    #[derive(Debug)]
    struct Slow;
    impl Codec for Slow {
        fn content_type(&self) -> &str {
            "application/octet-stream"
        }
        fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
            BytesCodec.encode(value)
        }
        fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
            BytesCodec.decode(body)
        }
    }

    #[test]
    fn fast_path_gives_what_the_value_path_gives() {
        let raw: Vec<u8> = (0..=255).collect();
        for bytes in [
            encode_with(&BytesCodec, &raw).unwrap(),
            encode_with(&BytesCodec, raw.as_slice()).unwrap(),
        ] {
            assert_eq!(bytes, encode_with(&Slow, &raw).unwrap());
        }
        assert_eq!(
            encode_with(&BytesCodec, "hé").unwrap(),
            encode_with(&Slow, "hé").unwrap()
        );
        assert_eq!(decode_with::<Vec<u8>>(&BytesCodec, &raw).unwrap(), raw);
        assert_eq!(
            decode_with::<Value>(&BytesCodec, &raw).unwrap(),
            decode_with::<Value>(&Slow, &raw).unwrap()
        );
        // Numbers out of range still refused, on either path.
        assert!(encode_with(&BytesCodec, &vec![256u32]).is_err());
        assert!(encode_with(&Slow, &vec![256u32]).is_err());
        // The default methods of a codec without a fast path.
        assert_eq!(Slow.encode_bytes(raw.clone()).unwrap(), raw);
        assert_eq!(Slow.decode_bytes(&raw).unwrap().as_ref(), raw.as_slice());
    }
}

/// Where a codec can come from: a [`Codec`] itself, a [`Connection`](crate::Connection) (its
/// default codec) or a [`Publisher`](crate::Publisher) (its codec).
pub trait CodecSource {
    /// Runs `f` with the codec.
    fn with_codec<R>(&self, f: impl FnOnce(&dyn Codec) -> R) -> R;
}

impl<C: Codec + ?Sized> CodecSource for C {
    fn with_codec<R>(&self, f: impl FnOnce(&dyn Codec) -> R) -> R {
        f(&CodecRef(self))
    }
}

/// A shared codec is a codec: what [`codecs::by_name`](crate::codecs::by_name) returns goes
/// straight to [`ConnectionOptions::codec`](crate::ConnectionOptions::codec),
/// [`PublisherOptions::codec`](crate::PublisherOptions::codec) or a consumer's.
impl<C: Codec + ?Sized> Codec for std::sync::Arc<C> {
    fn content_type(&self) -> &str {
        self.as_ref().content_type()
    }
    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
        self.as_ref().encode(value)
    }
    fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
        self.as_ref().decode(body)
    }
    fn encodes_bytes(&self) -> bool {
        self.as_ref().encodes_bytes()
    }
    fn encode_bytes(&self, bytes: Vec<u8>) -> Result<Vec<u8>, BoxError> {
        self.as_ref().encode_bytes(bytes)
    }
    fn decode_bytes<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, [u8]>, BoxError> {
        self.as_ref().decode_bytes(body)
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        self.as_ref().accepts(content_type)
    }
    fn decode_typed(&self, body: &[u8], content_type: Option<&str>) -> Result<Value, BoxError> {
        self.as_ref().decode_typed(body, content_type)
    }
}

// A `Connection` and a `Publisher` are codec sources too: their impls live with them
// (`connection/handle.rs`, `publish/publisher.rs`), above this base layer.

/// Lets an unsized codec be used as `&dyn Codec`.
#[derive(Debug)]
struct CodecRef<'a, C: ?Sized>(&'a C);

impl<C: Codec + ?Sized> Codec for CodecRef<'_, C> {
    fn content_type(&self) -> &str {
        self.0.content_type()
    }
    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
        self.0.encode(value)
    }
    fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
        self.0.decode(body)
    }
    fn encodes_bytes(&self) -> bool {
        self.0.encodes_bytes()
    }
    fn encode_bytes(&self, bytes: Vec<u8>) -> Result<Vec<u8>, BoxError> {
        self.0.encode_bytes(bytes)
    }
    fn decode_bytes<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, [u8]>, BoxError> {
        self.0.decode_bytes(body)
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        self.0.accepts(content_type)
    }
    fn decode_typed(&self, body: &[u8], content_type: Option<&str>) -> Result<Value, BoxError> {
        self.0.decode_typed(body, content_type)
    }
}

mod bytes;
