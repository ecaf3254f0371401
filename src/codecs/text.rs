//! [`TextCodec`], and the helpers every codec of this folder shares (a fatal refusal, the
//! content types a codec accepts, what a JSON value is called in an error).

use serde_json::Value;

use crate::codec::Codec;
use crate::error::{BoxError, FatalError};

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
