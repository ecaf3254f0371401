//! [`purge`]: the receipts (and retired outbox records) past the retention deleted, never one
//! a message still waiting could need.

use super::horizon::{horizon, Held};
use super::options::RetentionOptions;
use crate::connection::Connection;
use crate::envelope::now_ms;
use crate::error::Result;
use crate::patterns::idempotency::SqlIdempotencyStore;
use crate::patterns::outbox::SqlOutboxStore;

/// What a purge did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgeReport {
    /// The cutoff asked for: now less the retention (ms since the epoch).
    pub asked_cutoff_ms: i64,
    /// The cutoff used: the one asked for, or earlier when a waiting message is older.
    pub cutoff_ms: i64,
    /// The message that moved the cutoff back, when one did.
    pub held_by: Option<Held>,
    /// Messages read on the broker to find the horizon.
    pub scanned: usize,
    /// Receipts (and stale claims) deleted.
    pub receipts: u64,
    /// Retired outbox records deleted.
    pub retired_outbox: u64,
    /// The oldest waiting message is older than the store's own retention: its receipt may
    /// have expired already, purge or not (raise the store's retention).
    pub beyond_retention: bool,
}

impl std::fmt::Display for PurgeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "deleted {} receipts and {} retired outbox records",
            self.receipts, self.retired_outbox
        )?;
        if let Some(held) = &self.held_by {
            write!(
                f,
                "; receipts younger than {held} were kept (it may still be delivered again)"
            )?;
        }
        if self.beyond_retention {
            write!(
                f,
                "; that message is older than the store's retention: its receipt may have \
                 expired already"
            )?;
        }
        Ok(())
    }
}

/// Deletes the receipts of `receipts` confirmed longer than `options`' retention ago — **but
/// none confirmed after the oldest message still waiting on the broker was first sent**: that
/// message (a dead letter replayed next week, a retry waiting on its rung, a scheduled one)
/// may be a copy of one already handled, and its receipt is what makes the repeat harmless.
/// Then, with [`RetentionOptions::retired_outbox`], the retired records of `outbox` older
/// than the same cutoff.
///
/// # Errors
///
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for options without queues, or
/// when a queue holds more messages than the scan limit (nothing is deleted then); the
/// broker's or the database's error.
pub fn purge(
    connection: &Connection,
    receipts: &SqlIdempotencyStore,
    outbox: Option<&SqlOutboxStore>,
    options: &RetentionOptions,
) -> Result<PurgeReport> {
    options.validate()?;
    let older_than = i64::try_from(options.older_than.as_millis()).unwrap_or(i64::MAX);
    let asked = now_ms().saturating_sub(older_than);
    let found = horizon(connection, options)?;
    let held_by = found.oldest.filter(|h| h.first_seen_ms <= asked);
    let cutoff = held_by.as_ref().map_or(asked, |h| h.first_seen_ms - 1);
    let retention = i64::try_from(receipts.retention().as_millis()).unwrap_or(i64::MAX);
    let beyond_retention = held_by
        .as_ref()
        .is_some_and(|h| now_ms().saturating_sub(h.first_seen_ms) > retention);
    let deleted = receipts.purge_confirmed_before(cutoff)?;
    let retired = match outbox.filter(|_| options.retired_outbox) {
        Some(o) => o.purge_retired_before(cutoff)?,
        None => 0,
    };
    let report = PurgeReport {
        asked_cutoff_ms: asked,
        cutoff_ms: cutoff,
        held_by,
        scanned: found.scanned,
        receipts: deleted,
        retired_outbox: retired,
        beyond_retention,
    };
    log::info!("acemq: retention: {report}");
    Ok(report)
}
