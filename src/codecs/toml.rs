//! TOML (`application/toml`), through the `toml` crate.
//!
//! A TOML document is a table: only an object is written (anything else is refused at the
//! publisher, as Java and Go refuse it). Reads `application/toml`, `text/toml` and `*+toml`,
//! never a message with no content type (Python `codecs/toml.py`).

use serde_json::Value;

use super::{accepts_listed, fatal, kind_of};
use crate::codec::Codec;
use crate::error::BoxError;

/// What [`TomlCodec`] writes.
pub const TOML_CONTENT_TYPE: &str = "application/toml";

/// TOML through the `toml` crate (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default)]
pub struct TomlCodec;

impl Codec for TomlCodec {
    fn content_type(&self) -> &str {
        TOML_CONTENT_TYPE
    }
    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
        if !value.is_object() {
            return Err(format!(
                "acemq: cannot encode {} as TOML: a TOML document is a table, so the top level \
                 has to be an object (wrap it in one with a named key, or use JsonCodec)",
                kind_of(value)
            )
            .into());
        }
        Ok(toml::to_string(value)?.into_bytes())
    }
    fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
        let text = std::str::from_utf8(body)
            .map_err(|e| fatal(format!("acemq: this message is not TOML: {e}")))?;
        toml::from_str::<Value>(text)
            .map_err(|e| fatal(format!("acemq: this message is not TOML: {e}")))
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        accepts_listed(content_type, &["application/toml", "text/toml"], "+toml")
    }
}
