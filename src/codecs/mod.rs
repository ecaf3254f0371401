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
//! # Choosing by name
//!
//! [`by_name`] turns a name chosen in configuration into its codec — `json`, `bytes`, `text`
//! (or `string`), and with their features `yaml`, `toml`, `xml` — in any case; an unknown name
//! is an [`Error::InvalidArgument`] listing the names (and those behind a feature this build
//! lacks); `avro` and `protobuf` are refused, saying why: they need a schema, which a name
//! cannot carry. [`by_content_type`] does the same for a content type. This is Python's
//! `codec_by_name` and Java's `Codecs.byName`; `ACEMQ_FORMAT`
//! ([`Settings::codec`](crate::settings::Settings::codec)) reads through it.
//!
//! ```
//! use acemq_amqp::{codecs, ConnectionOptions};
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! let format = "text"; // from configuration
//! let options = ConnectionOptions::new().codec(codecs::by_name(format)?);
//! # let _ = options;
//! # Ok(()) }
//! ```
//!
//! # Choosing by content type
//!
//! [`CompositeCodec`] holds several codecs: the first one writes; on read, the candidates are
//! the codecs that [accept](Codec::accepts) the message's content type (every codec when the
//! message has none), tried in order, the first that reads the body winning; when none accepts,
//! or every candidate fails, the error names them all (a [`FatalError`](crate::FatalError): a
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
//! A body that cannot be read is a [`FatalError`](crate::FatalError) inside
//! [`Error::Codec`], so a consumer dead-letters it at once.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::codec::Codec;
use crate::error::{BoxError, Error, Result};

#[cfg(feature = "avro")]
#[cfg_attr(docsrs, doc(cfg(feature = "avro")))]
pub mod avro;
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub mod encrypted;
mod named;
#[cfg(feature = "protobuf")]
#[cfg_attr(docsrs, doc(cfg(feature = "protobuf")))]
pub mod protobuf;
mod text;
#[cfg(feature = "toml")]
#[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
pub mod toml;
#[cfg(feature = "xml")]
#[cfg_attr(docsrs, doc(cfg(feature = "xml")))]
pub mod xml;
#[cfg(feature = "yaml")]
#[cfg_attr(docsrs, doc(cfg(feature = "yaml")))]
pub mod yaml;

pub(crate) use named::canonical_name;
pub use named::{by_content_type, by_name, names};
// Shared by the optional codecs, each behind its feature: unused in a build without them.
#[allow(unused_imports)]
pub(crate) use text::{accepts_listed, fatal, kind_of};
pub use text::{TextCodec, TEXT_CONTENT_TYPE};

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
