//! Deleting retired outbox records past a retention (`patterns::retention`).

use super::store::SqlOutboxStore;
use crate::error::Result;
use crate::sql::{self, Value};

impl SqlOutboxStore {
    /// Deletes the **retired** records (failed `max_attempts` times: the relay no longer
    /// publishes them) created at or before `cutoff_ms` (ms since the epoch); returns how many.
    /// Pending records are never touched, and published ones are deleted when they are
    /// published. A retired record deleted is a message given up for good: keep it as long
    /// as someone may still [release](crate::patterns::outbox) it.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`](crate::Error::Sql) if the statement fails.
    pub fn purge_retired_before(&self, cutoff_ms: i64) -> Result<u64> {
        let mut conn = (self.connect)()?;
        let t = &self.table;
        let statement = conn.dialect().placeholders(&format!(
            "DELETE FROM {t} WHERE attempts >= $1 AND created_ms <= $2"
        ));
        conn.execute(
            &statement,
            &[
                Value::Integer(i64::from(self.max_attempts)),
                Value::Integer(cutoff_ms),
            ],
        )
        .map_err(|e| sql::rewrap(e, || format!("purging retired records in table {t}")))
    }
}
