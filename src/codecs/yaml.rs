//! YAML (`application/yaml`), through `serde_yaml_ng`.
//!
//! Written in block style, without a leading `---` (what Jackson's `YAMLGenerator` and Go's
//! `yaml.v3` write). Read with plain data only: no tags build anything, and a message with
//! no content type is never claimed (YAML reads JSON, and would report a JSON message as YAML).
//! Reads `application/yaml`, `application/x-yaml`, `text/yaml`, `text/x-yaml` and `*+yaml`
//! (Python `codecs/yaml.py`, as Java and Go).

use serde_json::Value;

use super::{accepts_listed, fatal};
use crate::codec::Codec;
use crate::error::BoxError;

/// What [`YamlCodec`] writes.
pub const YAML_CONTENT_TYPE: &str = "application/yaml";

/// YAML through `serde_yaml_ng` (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default)]
pub struct YamlCodec;

impl Codec for YamlCodec {
    fn content_type(&self) -> &str {
        YAML_CONTENT_TYPE
    }
    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
        let text = serde_yaml_ng::to_string(value)?;
        let text = text.strip_prefix("---\n").unwrap_or(&text);
        Ok(text.as_bytes().to_vec())
    }
    fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
        serde_yaml_ng::from_slice(body)
            .map_err(|e| fatal(format!("acemq: this message is not YAML: {e}")))
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        accepts_listed(
            content_type,
            &[
                "application/yaml",
                "application/x-yaml",
                "text/yaml",
                "text/x-yaml",
            ],
            "+yaml",
        )
    }
}
