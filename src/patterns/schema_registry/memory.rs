//! The in-process registry, for tests.

use std::fmt;

use parking_lot::Mutex;

use super::schema::{check_subject, fingerprint, same_format, Schema, SchemaRegistry};
use crate::error::{Error, Result};

/// A schema registry in one process, for tests. **Not for production**: see the
/// [module docs](super).
#[derive(Default)]
pub struct InMemorySchemaRegistry {
    schemas: Mutex<Vec<Schema>>,
}

impl InMemorySchemaRegistry {
    /// An empty registry.
    pub fn new() -> InMemorySchemaRegistry {
        InMemorySchemaRegistry::default()
    }
}

impl fmt::Debug for InMemorySchemaRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemorySchemaRegistry")
            .field("schemas", &self.schemas.lock().len())
            .finish()
    }
}

impl SchemaRegistry for InMemorySchemaRegistry {
    fn register(&self, subject: &str, format: &str, definition: &str) -> Result<Schema> {
        check_subject(subject)?;
        let fp = fingerprint(definition);
        let mut schemas = self.schemas.lock();
        if let Some(s) = schemas
            .iter()
            .find(|s| s.subject == subject && s.fingerprint == fp)
        {
            return same_format(s.clone(), format);
        }
        let version = schemas
            .iter()
            .filter(|s| s.subject == subject)
            .map(|s| s.version)
            .max()
            .unwrap_or(0)
            + 1;
        let schema = Schema {
            id: i64::try_from(schemas.len()).unwrap_or(i64::MAX - 1) + 1,
            subject: subject.to_owned(),
            version,
            format: format.to_owned(),
            definition: definition.to_owned(),
            fingerprint: fp,
        };
        schemas.push(schema.clone());
        Ok(schema)
    }

    fn by_id(&self, id: i64) -> Result<Schema> {
        self.schemas
            .lock()
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .ok_or_else(|| Error::SchemaNotFound {
                what: format!("id {id}"),
            })
    }

    fn latest(&self, subject: &str) -> Result<Schema> {
        self.schemas
            .lock()
            .iter()
            .filter(|s| s.subject == subject)
            .max_by_key(|s| s.version)
            .cloned()
            .ok_or_else(|| Error::SchemaNotFound {
                what: format!("subject {subject:?}"),
            })
    }

    fn versions(&self, subject: &str) -> Result<Vec<Schema>> {
        let mut out: Vec<Schema> = self
            .schemas
            .lock()
            .iter()
            .filter(|s| s.subject == subject)
            .cloned()
            .collect();
        out.sort_by_key(|s| s.version);
        Ok(out)
    }
}
