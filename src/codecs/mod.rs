//! The family's codecs beyond JSON and bytes, each optional format behind its own feature, and
//! choosing a codec by content type on read as the family does.
//!
//! [`JsonCodec`](crate::JsonCodec), [`BytesCodec`](crate::BytesCodec) and [`TextCodec`] need
//! nothing. The others are the formats the Java and Go libraries ship as optional modules, so a
//! message another AceMQ service wrote in one of them is readable here, and the other way round.
//! What each **writes** is the family's content type; what each **reads** (its
//! [`Codec::accepts`]) is the family's wider list, case-insensitive, by prefix (so parameters
//! such as `; charset=utf-8` do not matter) — Python `codecs/*.py`, matching Java and Go:
//!
//! | codec | feature | writes | also reads | no content type |
//! |---|---|---|---|---|
//! | [`JsonCodec`](crate::JsonCodec) | — | `application/json` | `text/json`, `*+json` | yes |
//! | [`TextCodec`] | — | `text/plain; charset=utf-8` | any `text/*` | no |
//! | [`BytesCodec`](crate::BytesCodec) | — | `application/octet-stream` | everything | yes |
//! | `YamlCodec` | `yaml` | `application/yaml` | `application/x-yaml`, `text/yaml`, `text/x-yaml`, `*+yaml` | no |
//! | `TomlCodec` | `toml` | `application/toml` | `text/toml`, `*+toml` | no |
//! | `XmlCodec` | `xml` | `application/xml` | `text/xml`, `*+xml` | no |
//! | `ProtobufCodec` | `protobuf` | `application/x-protobuf` | `application/protobuf`, `application/vnd.google.protobuf`, `*+protobuf` | no |
//! | `AvroCodec` | `avro` | `avro/binary`; registered: `application/vnd.acemq.avro` | `application/avro`, `*+avro` | see `AvroCodec` |
//! | `EncryptedCodec` | `encryption` | `application/vnd.acemq.encrypted` | — | no |
//!
//! # Choosing by content type
//!
//! [`CompositeCodec`] holds several codecs: the first one writes; on read, the candidates are
//! the codecs that [accept](Codec::accepts) the message's content type (every codec when the
//! message has none), tried in order, the first that reads the body winning; when none accepts,
//! or every candidate fails, the error names them all (a [`FatalError`]: a
//! consumer dead-letters it). [`Message::decode`](crate::Message::decode) and
//! [`Message::payload`](crate::Message::payload) hand the message's content type to the codec
//! ([`Codec::decode_typed`]). This is Python's `CompositeCodec`.
//!
//! # The payload
//!
//! A [`Codec`] works on `serde_json::Value`, so what a format reads arrives as JSON values: XML
//! as strings, objects, and arrays where a tag repeats (XML has no types); Avro records as
//! objects; protobuf messages as objects keyed by the `.proto` field names. Objects keep the
//! order their fields were written in (this crate turns on `serde_json`'s `preserve_order`): a
//! struct's fields come out in declaration order, as the family's libraries write them, so the
//! YAML, TOML and XML of the same payload are the family's bytes (`tests/fixtures/codec_interop.json`).
//!
//! A body that cannot be read is a [`FatalError`] inside
//! [`Error::Codec`], so a consumer dead-letters it at once.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::codec::Codec;
use crate::error::FatalError;
use crate::error::{BoxError, Error, Result};

#[cfg(feature = "avro")]
#[cfg_attr(docsrs, doc(cfg(feature = "avro")))]
pub mod avro;
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub mod encrypted;
#[cfg(feature = "protobuf")]
#[cfg_attr(docsrs, doc(cfg(feature = "protobuf")))]
pub mod protobuf;
#[cfg(feature = "toml")]
#[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
pub mod toml;
#[cfg(feature = "xml")]
#[cfg_attr(docsrs, doc(cfg(feature = "xml")))]
pub mod xml;
#[cfg(feature = "yaml")]
#[cfg_attr(docsrs, doc(cfg(feature = "yaml")))]
pub mod yaml;

/// What [`TextCodec`] writes.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// A fatal codec failure: the same bytes never read better on a later attempt.
#[allow(dead_code)] // used by the feature-gated codecs only
pub(crate) fn fatal(text: impl Into<String>) -> BoxError {
    Box::new(FatalError::new(text.into()))
}

/// True when `content_type` starts with one of `prefixes` or contains `+suffix`
/// (case-insensitive); never for no content type.
#[allow(dead_code)] // used by the feature-gated codecs only
pub(crate) fn accepts_listed(content_type: Option<&str>, prefixes: &[&str], suffix: &str) -> bool {
    let Some(ct) = content_type.filter(|c| !c.is_empty()) else {
        return false;
    };
    let ct = ct.to_ascii_lowercase();
    prefixes.iter().any(|p| ct.starts_with(p)) || ct.contains(suffix)
}

/// UTF-8 text (`text/plain; charset=utf-8`): encodes a string, decodes to a string; reads any
/// `text/*`, never a message with no content type (Python `TextCodec`).
#[derive(Clone, Copy, Debug, Default)]
pub struct TextCodec;

impl Codec for TextCodec {
    fn content_type(&self) -> &str {
        TEXT_CONTENT_TYPE
    }
    fn encode(&self, value: &Value) -> std::result::Result<Vec<u8>, BoxError> {
        match value {
            Value::String(s) => Ok(s.as_bytes().to_vec()),
            other => {
                Err(format!("acemq: TextCodec encodes a string, not {}", kind_of(other)).into())
            }
        }
    }
    fn decode(&self, body: &[u8]) -> std::result::Result<Value, BoxError> {
        match std::str::from_utf8(body) {
            Ok(s) => Ok(Value::String(s.to_string())),
            Err(e) => Err(fatal(format!("acemq: this message is not UTF-8 text: {e}"))),
        }
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        accepts_listed(content_type, &["text/"], "\u{0}")
    }
}

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Several codecs: the first writes, the one the content type names reads (see the
/// [module docs](self)).
///
/// ```
/// use acemq_amqp::codecs::{CompositeCodec, TextCodec};
/// use acemq_amqp::{JsonCodec, Message};
///
/// # fn main() -> acemq_amqp::Result<()> {
/// let codec = CompositeCodec::new(JsonCodec).or(TextCodec);
/// let text = Message::new("hello").with_content_type("text/plain");
/// assert_eq!(text.decode::<String>(&codec)?, "hello");
/// let json = Message::new(r#""hello""#).with_content_type("application/json");
/// assert_eq!(json.decode::<String>(&codec)?, "hello");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CompositeCodec {
    codecs: Vec<Arc<dyn Codec>>,
}

impl CompositeCodec {
    /// A composite whose first codec (the one that writes) is `first`.
    pub fn new(first: impl Codec + 'static) -> CompositeCodec {
        CompositeCodec {
            codecs: vec![Arc::new(first)],
        }
    }

    /// Adds a codec, tried after those already held.
    pub fn or(mut self, codec: impl Codec + 'static) -> CompositeCodec {
        self.codecs.push(Arc::new(codec));
        self
    }

    /// A composite of shared codecs, the first one writing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `codecs` is empty.
    pub fn of(codecs: Vec<Arc<dyn Codec>>) -> Result<CompositeCodec> {
        if codecs.is_empty() {
            return Err(Error::invalid("a CompositeCodec needs at least one codec"));
        }
        Ok(CompositeCodec { codecs })
    }

    /// The codecs, in the order they are tried.
    pub fn codecs(&self) -> &[Arc<dyn Codec>] {
        &self.codecs
    }

    fn describe(&self) -> String {
        self.codecs
            .iter()
            .map(|c| c.content_type())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Debug for CompositeCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CompositeCodec({})", self.describe())
    }
}

impl Codec for CompositeCodec {
    fn content_type(&self) -> &str {
        self.codecs[0].content_type()
    }
    fn encode(&self, value: &Value) -> std::result::Result<Vec<u8>, BoxError> {
        self.codecs[0].encode(value)
    }
    fn decode(&self, body: &[u8]) -> std::result::Result<Value, BoxError> {
        self.decode_typed(body, None)
    }
    fn encodes_bytes(&self) -> bool {
        self.codecs[0].encodes_bytes()
    }
    fn encode_bytes(&self, bytes: Vec<u8>) -> std::result::Result<Vec<u8>, BoxError> {
        self.codecs[0].encode_bytes(bytes)
    }
    fn decode_bytes<'a>(&self, body: &'a [u8]) -> std::result::Result<Cow<'a, [u8]>, BoxError> {
        // Bytes are read as bytes by whichever codec writes them.
        self.codecs[0].decode_bytes(body)
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        self.codecs.iter().any(|c| c.accepts(content_type))
    }
    fn decode_typed(
        &self,
        body: &[u8],
        content_type: Option<&str>,
    ) -> std::result::Result<Value, BoxError> {
        let content_type = content_type.filter(|c| !c.is_empty());
        let candidates: Vec<&Arc<dyn Codec>> = match content_type {
            None => self.codecs.iter().collect(),
            Some(_) => self
                .codecs
                .iter()
                .filter(|c| c.accepts(content_type))
                .collect(),
        };
        if candidates.is_empty() {
            return Err(fatal(format!(
                "acemq: no codec here reads {:?}; this one holds {}",
                content_type.unwrap_or_default(),
                self.describe()
            )));
        }
        let mut refusals = Vec::new();
        for codec in candidates {
            match codec.decode_typed(body, content_type) {
                Ok(v) => return Ok(v),
                Err(e) => refusals.push(format!("{}: {e}", codec.content_type())),
            }
        }
        Err(fatal(format!(
            "acemq: no codec could read this message. Tried {}",
            refusals.join("; ")
        )))
    }
}
