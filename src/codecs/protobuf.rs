//! Protocol Buffers (`application/x-protobuf`), through `prost-reflect`.
//!
//! A codec is built for **one message type**, as in Java and Python: protobuf bytes carry no
//! name. Since a [`Codec`] works on `serde_json::Value`, the type is given as a
//! [`MessageDescriptor`] (from a compiled `FileDescriptorSet`, e.g. what `protoc
//! --descriptor_set_out` or `prost-build` writes, loaded into a
//! [`DescriptorPool`](prost_reflect::DescriptorPool)) and messages are read into JSON objects
//! keyed by the **`.proto` field names** (`order_id`), 64-bit integers as numbers, fields at
//! their default value included; writing takes an object keyed by the `.proto` or JSON field
//! names. The wire bytes are the standard protobuf encoding, identical in every runtime.
//!
//! Reads `application/x-protobuf`, `application/protobuf`, `application/vnd.google.protobuf`
//! and `*+protobuf` (Python: the union of Java's and Go's), never a message with no content
//! type (protobuf bytes are not recognisable).

pub use prost_reflect;
use prost_reflect::prost::Message as _;
use prost_reflect::{DynamicMessage, MessageDescriptor, SerializeOptions};
use serde_json::Value;

use super::{accepts_listed, fatal};
use crate::codec::Codec;
use crate::error::BoxError;

/// What [`ProtobufCodec`] writes.
pub const PROTOBUF_CONTENT_TYPE: &str = "application/x-protobuf";

/// One protobuf message type (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct ProtobufCodec {
    descriptor: MessageDescriptor,
}

impl ProtobufCodec {
    /// A codec for the message type `descriptor`.
    pub fn new(descriptor: MessageDescriptor) -> ProtobufCodec {
        ProtobufCodec { descriptor }
    }

    /// The message type.
    pub fn descriptor(&self) -> &MessageDescriptor {
        &self.descriptor
    }
}

impl Codec for ProtobufCodec {
    fn content_type(&self) -> &str {
        PROTOBUF_CONTENT_TYPE
    }
    fn encode(&self, value: &Value) -> Result<Vec<u8>, BoxError> {
        let message = DynamicMessage::deserialize(self.descriptor.clone(), value).map_err(|e| {
            format!(
                "acemq: this payload is not a {}: {e}",
                self.descriptor.full_name()
            )
        })?;
        Ok(message.encode_to_vec())
    }
    fn decode(&self, body: &[u8]) -> Result<Value, BoxError> {
        let message = DynamicMessage::decode(self.descriptor.clone(), body).map_err(|e| {
            fatal(format!(
                "acemq: this message is not a {}: {e}",
                self.descriptor.full_name()
            ))
        })?;
        let options = SerializeOptions::new()
            .use_proto_field_name(true)
            .stringify_64_bit_integers(false)
            .skip_default_fields(false);
        Ok(message.serialize_with_options(serde_json::value::Serializer, &options)?)
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        accepts_listed(
            content_type,
            &[
                "application/x-protobuf",
                "application/protobuf",
                "application/vnd.google.protobuf",
            ],
            "+protobuf",
        )
    }
}
