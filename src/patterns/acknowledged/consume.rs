//! The recipe: [`consume`], and the [`Report`] it returns.

use super::batcher::Batcher;
use super::delivery::{Acknowledge, Delivery};
use super::isolate::{apply_isolating, Applied};
use super::source::Source;
use super::store_apply::ApplyBatch;
use crate::error::Result;

/// What [`consume`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Report {
    /// Deliveries acknowledged (applied now or replayed).
    pub acknowledged: u64,
    /// Of those, replays of an identity already done: acknowledged without running the effect.
    pub replayed: u64,
    /// Deliveries not acknowledged because they failed: alone after their batch rolled back,
    /// or with a batch the store failed as a whole. A delivery that is redelivered and fails
    /// again is counted again.
    pub failed: u64,
}

/// Consumes `source` until it ends or `batcher` is stopped: applies its deliveries in batches
/// of up to the batcher's [`batch_size`](super::BatcherOptions::batch_size) through `store`,
/// and acknowledges each delivery after its batch committed.
///
/// At most [`max_pending`](super::BatcherOptions::max_pending) deliveries are taken from the
/// source and not yet acknowledged (or failed). The options are validated by [`Batcher::new`],
/// before anything is consumed. When the batcher's [`StopHandle`](crate::StopHandle) is stopped, this
/// stops taking deliveries, applies and acknowledges those it has taken, closes the source and
/// returns the report. The source is closed before this returns, on every path. See the
/// [module docs](super) for what happens on failures and crashes.
///
/// # Errors
///
/// The first error of the source, of an acknowledgement, or of closing the source. A batch that
/// fails in the store is not an error of `consume`: it is counted in [`Report::failed`].
pub fn consume<S, T, St, A>(
    source: S,
    store: &St,
    mut acknowledge: A,
    batcher: &Batcher,
) -> Result<Report>
where
    S: Source<Item = Delivery<T>>,
    T: Send,
    St: ApplyBatch + ?Sized,
    A: Acknowledge<T>,
{
    let mut report = Report::default();
    batcher.run_batches(
        source,
        |batch: &[Delivery<T>]| Ok(apply_isolating(store, batch)),
        |deliveries: Vec<Delivery<T>>, result: Result<Vec<Applied>>| {
            let n = deliveries.len() as u64;
            let applied = match result {
                Ok(applied) => applied,
                Err(e) => {
                    // The worker could not apply the batch at all.
                    log::warn!(
                        "acknowledged consumer: a batch of {n} deliveries was rolled back and \
                         not acknowledged: {e}"
                    );
                    report.failed += n;
                    return acknowledge.failed(&deliveries, &e);
                }
            };
            settle_batch(&mut acknowledge, &mut report, deliveries, applied)
        },
    )?;
    Ok(report)
}

/// Settles one applied batch: acknowledges what committed (as one batch), then tells the
/// acknowledgement about each message rejected through its own fault, then about the rest that
/// rolled back (together, with the first of their errors).
fn settle_batch<T, A: Acknowledge<T>>(
    acknowledge: &mut A,
    report: &mut Report,
    deliveries: Vec<Delivery<T>>,
    applied: Vec<Applied>,
) -> Result<()> {
    let (mut committed, mut rejected, mut rolled_back) = (Vec::new(), Vec::new(), Vec::new());
    let mut rolled_back_error = None;
    for (d, a) in deliveries.into_iter().zip(applied) {
        match a {
            Applied::Committed(receipt) => {
                report.replayed += u64::from(receipt.is_replay());
                committed.push(d);
            }
            Applied::Rejected(e) => rejected.push((d, e)),
            Applied::RolledBack(e) => {
                rolled_back_error.get_or_insert(e);
                rolled_back.push(d);
            }
        }
    }
    if !committed.is_empty() {
        acknowledge.acknowledge_batch(&committed)?;
        report.acknowledged += committed.len() as u64;
    }
    for (d, e) in &rejected {
        log::warn!(
            "acknowledged consumer: message {:?} failed on its own and was not acknowledged: {e}",
            d.message.identifier
        );
        report.failed += 1;
        acknowledge.rejected(d, e)?;
    }
    if let Some(e) = rolled_back_error {
        log::warn!(
            "acknowledged consumer: {} deliveries were rolled back and not acknowledged: {e}",
            rolled_back.len()
        );
        report.failed += rolled_back.len() as u64;
        acknowledge.failed(&rolled_back, &e)?;
    }
    Ok(())
}
