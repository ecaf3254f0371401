//! Deleting receipts confirmed before a cutoff (`patterns::retention`).

use super::statements::{CLAIMED, CONFIRMED};
use super::store::SqlIdempotencyStore;
use crate::error::Result;
use crate::sql::Value;

impl SqlIdempotencyStore {
    /// Deletes the receipts confirmed at or before `cutoff_ms` (ms since the epoch; a
    /// receipt's confirm time is its deadline less the store's retention) and the claims whose
    /// lease has passed; returns how many rows. **Unguarded**: a receipt deleted lets its
    /// message's effect happen again if the message is delivered again —
    /// [`patterns::retention::purge`](crate::patterns::retention::purge) finds the cutoff that
    /// cannot, from the messages still waiting on the broker.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`](crate::Error::Sql) if the statement fails.
    pub fn purge_confirmed_before(&self, cutoff_ms: i64) -> Result<u64> {
        let mut conn = (self.connect)()?;
        let t = &self.table;
        let dialect = conn.dialect();
        let now = dialect.now_ms_sql();
        let statement = dialect.placeholders(&format!(
            "DELETE FROM {t} WHERE (state = '{CONFIRMED}' AND deadline_ms <= $1) \
             OR (state = '{CLAIMED}' AND deadline_ms <= {now})"
        ));
        let retention = i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX);
        conn.execute(
            &statement,
            &[Value::Integer(cutoff_ms.saturating_add(retention))],
        )
        .map_err(|e| self.context(e, "purging receipts"))
    }
}
