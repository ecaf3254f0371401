//! A row of the outbox table read back as an [`OutboxRecord`].

use crate::error::{Error, Result};
use crate::patterns::outbox::store::OutboxRecord;
use crate::sql::{self, Value};

pub(crate) fn record(row: &[Value]) -> Result<OutboxRecord> {
    let headers = sql::col_text(row, 5)?;
    let headers = if headers.is_empty() {
        serde_json::Map::new()
    } else {
        serde_json::from_str(&headers).map_err(|e| Error::Codec {
            content_type: "application/json".into(),
            source: format!("the headers column is not a JSON object: {e}").into(),
        })?
    };
    Ok(OutboxRecord {
        id: sql::col_i64(row, 0)?,
        exchange: sql::col_text(row, 1)?,
        routing_key: sql::col_text(row, 2)?,
        body: sql::col_bytes(row, 3)?,
        content_type: sql::col_text(row, 4)?,
        headers,
        created_ms: sql::col_i64(row, 6)?,
        attempts: sql::col_i64(row, 7)?,
        last_error: sql::col_opt_text(row, 8)?,
    })
}

/// What can be read of a row [`record`] refuses (a retired row another program wrote): its id,
/// and every other column that reads, the rest left empty.
pub(super) fn record_lossy(row: &[Value]) -> Result<OutboxRecord> {
    Ok(OutboxRecord {
        id: sql::col_i64(row, 0)?,
        exchange: sql::col_text(row, 1).unwrap_or_default(),
        routing_key: sql::col_text(row, 2).unwrap_or_default(),
        body: sql::col_bytes(row, 3).unwrap_or_default(),
        content_type: sql::col_text(row, 4).unwrap_or_default(),
        headers: serde_json::Map::new(),
        created_ms: sql::col_i64(row, 6).unwrap_or_default(),
        attempts: sql::col_i64(row, 7).unwrap_or_default(),
        last_error: sql::col_opt_text(row, 8).unwrap_or_default(),
    })
}
