//! Avro, through the Apache project's `apache-avro` crate.
//!
//! Avro bytes describe nothing about themselves: a reader must hold the schema the writer used.
//! Two modes, as in the family (Python `codecs/avro.py`, Java `AvroCodec`, Go `codec/avro`):
//!
//! - **fixed** ([`AvroCodec::new`]): one schema for writing and reading; writes the bare Avro
//!   body with content type `avro/binary`;
//! - **registered** ([`AvroCodec::registered`]): writes Confluent's framing — one zero byte,
//!   the schema identifier as four bytes big-endian, then the body — with content type
//!   `application/vnd.acemq.avro`; reads a framed body with the writer schema registered under
//!   its identifier ([`learn`](AvroCodec::learn) the versions it will meet; e.g. from a
//!   [`SchemaRegistry`](crate::patterns::schema_registry::SchemaRegistry)), resolved onto the codec's reader
//!   schema (a field the writer added is skipped, one it did not write takes the reader's
//!   default). [`AvroCodec::reading`] reads only.
//!
//! **The content type decides the framing** (all five libraries): `avro/binary`,
//! `application/avro` or `*+avro` is read unframed with the codec's schema, whatever its first
//! byte; `application/vnd.acemq.avro` is read framed (a fixed codec refuses it: five bytes of
//! framing read as the first field would be silent nonsense). With no content type, or one that
//! is not Avro, a fixed codec refuses a body that starts with a zero byte (it looks framed) and
//! a registered one reads it framed. An identifier the codec was not taught, or a body that does
//! not fit the schema, is a [`FatalError`](crate::FatalError). Neither mode ever claims a
//! message with no content type in a [`CompositeCodec`](super::CompositeCodec).
//!
//! Values: a JSON object is written as a record (fields by name, resolved against the schema:
//! integers to `int`/`long`, and so on); a record is read as a JSON object.

use std::collections::HashMap;
use std::sync::Arc;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use parking_lot::RwLock;
use serde_json::Value;

use super::fatal;
use crate::codec::Codec;
use crate::error::{BoxError, Error, Result};

/// What a fixed-schema codec writes.
pub const AVRO_CONTENT_TYPE: &str = "avro/binary";
/// What a registered codec writes.
pub const AVRO_REGISTERED_CONTENT_TYPE: &str = "application/vnd.acemq.avro";
const FRAME_BYTES: usize = 5;

/// Avro (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct AvroCodec {
    schema: Arc<Schema>,
    reader: Arc<Schema>,
    schema_id: Option<u32>,
    registered: bool,
    known: Arc<RwLock<HashMap<u32, Arc<Schema>>>>,
}

fn parse(text: &str) -> Result<Schema> {
    Schema::parse_str(text)
        .map_err(|e| Error::invalid(format!("this is not a usable Avro schema: {e}")))
}

impl AvroCodec {
    /// A fixed-schema codec (`avro/binary`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `schema` is not a usable Avro schema.
    pub fn new(schema: &str) -> Result<AvroCodec> {
        let schema = Arc::new(parse(schema)?);
        Ok(AvroCodec {
            reader: schema.clone(),
            schema,
            schema_id: None,
            registered: false,
            known: Arc::default(),
        })
    }

    /// A registered codec writing `schema` framed with `schema_id`
    /// (`application/vnd.acemq.avro`), reading onto `schema` too.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an unusable schema or an identifier of 0.
    pub fn registered(schema: &str, schema_id: u32) -> Result<AvroCodec> {
        if schema_id == 0 {
            return Err(Error::invalid("a schema identifier is a positive integer"));
        }
        let mut codec = AvroCodec::new(schema)?;
        codec.schema_id = Some(schema_id);
        codec.registered = true;
        codec.known.write().insert(schema_id, codec.schema.clone());
        Ok(codec)
    }

    /// A registered codec that only reads, resolving every message onto `reader_schema`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an unusable schema.
    pub fn reading(reader_schema: &str) -> Result<AvroCodec> {
        let mut codec = AvroCodec::new(reader_schema)?;
        codec.registered = true;
        Ok(codec)
    }

    /// Resolves every message read onto `reader_schema` instead of the writing schema.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an unusable schema.
    pub fn reader_schema(mut self, reader_schema: &str) -> Result<AvroCodec> {
        self.reader = Arc::new(parse(reader_schema)?);
        Ok(self)
    }

    /// Teaches the codec the writer schema registered under `schema_id`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an unusable schema.
    pub fn learn(&self, schema_id: u32, schema: &str) -> Result<()> {
        let schema = Arc::new(parse(schema)?);
        self.known.write().insert(schema_id, schema);
        Ok(())
    }

    /// The identifier framed into each message (registered mode).
    pub fn schema_id(&self) -> Option<u32> {
        self.schema_id
    }

    /// True in registered mode.
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    fn read(&self, writer: &Schema, body: &[u8]) -> std::result::Result<Value, BoxError> {
        let mut bytes = body;
        let value = GenericDatumReader::builder(writer)
            .reader_schema(&self.reader)
            .build()
            .and_then(|r| r.read_value(&mut bytes))
            .map_err(|e| {
                fatal(format!(
                    "acemq: this message is not Avro of this schema: {e}"
                ))
            })?;
        if !bytes.is_empty() {
            return Err(fatal(format!(
                "acemq: this message is not Avro of this schema: {} bytes left over",
                bytes.len()
            )));
        }
        Value::try_from(value)
            .map_err(|e| fatal(format!("acemq: this Avro value has no JSON form: {e}")))
    }

    fn read_framed(&self, body: &[u8]) -> std::result::Result<Value, BoxError> {
        if body.len() < FRAME_BYTES || body[0] != 0 {
            return Err(fatal(
                "acemq: this message says it is framed Avro (application/vnd.acemq.avro) but \
                 does not start with a zero byte and a four-byte schema identifier",
            ));
        }
        let id = u32::from_be_bytes([body[1], body[2], body[3], body[4]]);
        let writer = self.known.read().get(&id).cloned().ok_or_else(|| {
            fatal(format!(
                "acemq: this message was written with Avro schema id {id}, which this codec \
                 has not been taught (AvroCodec::learn)"
            ))
        })?;
        self.read(&writer, &body[FRAME_BYTES..])
    }

    fn read_unframed(&self, body: &[u8]) -> std::result::Result<Value, BoxError> {
        self.read(&self.schema, body)
    }
}

/// A JSON value as an Avro value before resolution against the schema (integers as `long`,
/// objects as maps, which resolution turns into records).
fn to_avro(value: &Value) -> apache_avro::types::Value {
    use apache_avro::types::Value as A;
    match value {
        Value::Null => A::Null,
        Value::Bool(b) => A::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => A::Long(i),
            None => A::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => A::String(s.clone()),
        Value::Array(items) => A::Array(items.iter().map(to_avro).collect()),
        Value::Object(map) => A::Map(map.iter().map(|(k, v)| (k.clone(), to_avro(v))).collect()),
    }
}

fn is_fixed_type(ct: &str) -> bool {
    ct.starts_with(AVRO_CONTENT_TYPE) || ct.starts_with("application/avro") || ct.contains("+avro")
}

impl Codec for AvroCodec {
    fn content_type(&self) -> &str {
        if self.registered {
            AVRO_REGISTERED_CONTENT_TYPE
        } else {
            AVRO_CONTENT_TYPE
        }
    }
    fn encode(&self, value: &Value) -> std::result::Result<Vec<u8>, BoxError> {
        if self.registered && self.schema_id.is_none() {
            return Err(
                "acemq: this Avro codec only reads (AvroCodec::reading): it has no schema \
                 identifier to write with"
                    .into(),
            );
        }
        let avro = to_avro(value).resolve(&self.schema)?;
        let body = GenericDatumWriter::builder(&self.schema)
            .build()?
            .write_value_to_vec(avro)?;
        Ok(match self.schema_id {
            Some(id) => {
                let mut framed = Vec::with_capacity(FRAME_BYTES + body.len());
                framed.push(0);
                framed.extend_from_slice(&id.to_be_bytes());
                framed.extend_from_slice(&body);
                framed
            }
            None => body,
        })
    }
    fn decode(&self, body: &[u8]) -> std::result::Result<Value, BoxError> {
        self.decode_typed(body, None)
    }
    fn decode_typed(
        &self,
        body: &[u8],
        content_type: Option<&str>,
    ) -> std::result::Result<Value, BoxError> {
        let ct = content_type.unwrap_or_default().to_ascii_lowercase();
        if ct.starts_with(AVRO_REGISTERED_CONTENT_TYPE) {
            if !self.registered {
                return Err(fatal(
                    "acemq: this message is framed Avro (application/vnd.acemq.avro) and this \
                     codec has a fixed schema: reading the framing as the first field would be \
                     nonsense; use AvroCodec::registered or AvroCodec::reading",
                ));
            }
            return self.read_framed(body);
        }
        if is_fixed_type(&ct) {
            return self.read_unframed(body);
        }
        // No content type, or not an Avro one: only the leading zero byte has a vote.
        let looks_framed = body.len() >= FRAME_BYTES && body[0] == 0;
        match (self.registered, looks_framed) {
            (true, true) => self.read_framed(body),
            (false, true) => Err(fatal(
                "acemq: this message does not say it is Avro and starts with a zero byte, as \
                 framed Avro does: refused rather than guessed",
            )),
            (_, false) => self.read_unframed(body),
        }
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        let Some(ct) = content_type.filter(|c| !c.is_empty()) else {
            return false;
        };
        let ct = ct.to_ascii_lowercase();
        is_fixed_type(&ct) || (self.registered && ct.starts_with(AVRO_REGISTERED_CONTENT_TYPE))
    }
}
