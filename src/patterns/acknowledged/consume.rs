//! The recipe: [`consume`] and [`consume_with`], and the [`Report`] they return.

use super::batcher::{Batcher, BatcherOptions};
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

/// How [`consume`] batches: the largest batch and the intake bound.
///
/// ```
/// use acemq_amqp::patterns::acknowledged::ConsumeOptions;
/// let options = ConsumeOptions::new().batch_size(32).max_pending(64);
/// # let _ = options;
/// ```
///
/// For a poll interval or a stop handle, configure a [`Batcher`] and use [`consume_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeOptions {
    batch_size: usize,
    max_pending: Option<usize>,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        ConsumeOptions {
            batch_size: 32,
            max_pending: None,
        }
    }
}

impl ConsumeOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The largest batch: the most deliveries applied in one transaction. Defaults to 32; must
    /// be at least 1.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// The most deliveries taken from the source and not yet acknowledged (or failed).
    /// Defaults to twice the batch size; must be at least 1. Over AMQP, give the queue a
    /// prefetch of at least this plus one ([`AmqpQueue::open`](super::AmqpQueue::open)).
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.max_pending = Some(max_pending);
        self
    }

    /// The batcher these options describe.
    fn batcher(&self) -> Result<Batcher> {
        let options = BatcherOptions::new().batch_size(self.batch_size);
        Batcher::new(match self.max_pending {
            Some(n) => options.max_pending(n),
            None => options,
        })
    }
}

/// Consumes `source` until it ends: applies its deliveries in batches of up to
/// [`batch_size`](ConsumeOptions::batch_size) through `store`, and acknowledges each delivery
/// after its batch committed.
///
/// At most [`max_pending`](ConsumeOptions::max_pending) deliveries are taken from the source and
/// not yet acknowledged (or failed). The source is closed before this returns, on every path
/// but an invalid option (then it is dropped unpolled). See the [module docs](super) for what
/// happens on failures and crashes; to stop it from another thread use [`consume_with`] and a
/// [`Batcher`]'s [`StopHandle`](crate::StopHandle).
///
/// # Errors
///
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the batch size or `max_pending` is zero; otherwise the first
/// error of the source, of an acknowledgement, or of closing the source. A batch that fails in
/// the store is not an error of `consume`: it is counted in [`Report::failed`].
pub fn consume<S, T, St, A>(
    source: S,
    store: &St,
    acknowledge: A,
    options: ConsumeOptions,
) -> Result<Report>
where
    S: Source<Item = Delivery<T>>,
    T: Send,
    St: ApplyBatch + ?Sized,
    A: Acknowledge<T>,
{
    let batcher = options.batcher()?;
    consume_with(source, store, acknowledge, &batcher)
}

/// [`consume`] with a configured [`Batcher`] (its batch size, intake bound, poll interval and
/// stop handle).
///
/// When the batcher's [`StopHandle`](crate::StopHandle) is stopped, this stops taking deliveries, applies and
/// acknowledges those it has taken, closes the source and returns the report.
///
/// # Errors
///
/// As for [`consume`].
pub fn consume_with<S, T, St, A>(
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
