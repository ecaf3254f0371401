//! What a registry holds and promises: the [`Schema`], its [`fingerprint`], and the
//! [`SchemaRegistry`] trait, with the checks every registry makes.

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The fingerprint of a schema definition: lowercase hex SHA-256 of its exact bytes.
///
/// ```
/// use acemq_amqp::patterns::schema_registry::fingerprint;
/// assert_eq!(
///     fingerprint(""),
///     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
/// );
/// ```
pub fn fingerprint(definition: impl AsRef<[u8]>) -> String {
    let digest = Sha256::digest(definition.as_ref());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A registered schema.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schema {
    /// The registry-wide id.
    pub id: i64,
    /// The subject it is registered under.
    pub subject: String,
    /// Its version within the subject, from 1.
    pub version: i64,
    /// The schema language, e.g. `json-schema`, `avro`, `protobuf`.
    pub format: String,
    /// The definition, exactly as registered.
    pub definition: String,
    /// [`fingerprint`] of the definition.
    pub fingerprint: String,
}

/// Registers and looks up schemas.
pub trait SchemaRegistry: Send + Sync {
    /// Registers `definition` under `subject`, or returns the existing schema with the same
    /// bytes under that subject.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty subject or when the same bytes are registered
    /// under the subject with another format; a store error such as [`Error::Sql`].
    fn register(&self, subject: &str, format: &str, definition: &str) -> Result<Schema>;

    /// The schema with this id.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaNotFound`] if there is none; a store error.
    fn by_id(&self, id: i64) -> Result<Schema>;

    /// The subject's latest version.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaNotFound`] if the subject has none; a store error.
    fn latest(&self, subject: &str) -> Result<Schema>;

    /// The subject's schemas, by version ascending (empty for an unknown subject).
    ///
    /// # Errors
    ///
    /// A store error.
    fn versions(&self, subject: &str) -> Result<Vec<Schema>>;
}

pub(super) fn check_subject(subject: &str) -> Result<()> {
    if subject.is_empty() {
        return Err(Error::invalid("a schema subject must not be empty"));
    }
    Ok(())
}

pub(super) fn same_format(existing: Schema, format: &str) -> Result<Schema> {
    if existing.format == format {
        Ok(existing)
    } else {
        Err(Error::invalid(format!(
            "subject {:?} already has these exact bytes as version {} with format {:?}, not {:?}",
            existing.subject, existing.version, existing.format, format
        )))
    }
}
