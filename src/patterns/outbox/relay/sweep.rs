//! The sweeps: one batch on demand (`sweep`), and the started relay's thread, which pipelines
//! them (`run`, `pump`): a full batch left in flight while the next is handed over, the batch
//! confirmed before deleted and the next leased in one commit.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::backlog::Backlog;
use super::batch::HandedOver;
use super::state::{ids, Core};
use crate::error::Result;
use crate::patterns::outbox::store::OutboxRecord;

/// A batch leased ahead by a started relay (in the commit that deleted the batch before), and
/// when: its lease, and so its deadline, counts from then, not from its hand-over.
pub(super) struct Leased {
    records: Vec<OutboxRecord>,
    at: Instant,
}

/// A full batch handed to the broker whose confirms the started relay awaits only after it has
/// handed over the next batch (see [`Core::pump`]).
pub(super) struct InFlight {
    records: Vec<OutboxRecord>,
    handed: HandedOver,
    deadline: Instant,
}

impl Core {
    /// The sweeper thread: sweeps, and after a sweep that found less than a full batch waits
    /// the interval or until told to stop; stopping, it deletes what went out and gives back
    /// what it leased ahead.
    pub(super) fn run(&self, stop: &Receiver<()>) {
        let (mut next, mut to_delete, mut flying): (Option<Leased>, _, _) =
            (None, Vec::new(), None);
        let mut backlog = Backlog::new();
        loop {
            let full = match self.pump(&mut next, &mut to_delete, &mut flying) {
                Ok(n) => n >= self.options.batch_size,
                Err(e) => {
                    log::warn!("acemq: outbox sweep failed: {e}");
                    false
                }
            };
            if !full {
                if let Err(e) = self.flush(&mut to_delete) {
                    log::warn!("acemq: deleting published outbox records: {e}");
                }
            }
            // The backlog gauge.
            backlog.after_sweep(self, full);
            let wait = if full {
                Duration::ZERO
            } else {
                self.options.interval
            };
            if !matches!(stop.recv_timeout(wait), Err(RecvTimeoutError::Timeout)) {
                // Stopping: await the batch in flight, delete what went out, give back what
                // was leased.
                if let Some(f) = flying.take() {
                    if let Err(e) = self.settle(f, &mut to_delete, None) {
                        log::warn!("acemq: outbox sweep failed: {e}");
                    }
                }
                if let Err(e) = self.flush(&mut to_delete) {
                    log::warn!("acemq: deleting published outbox records: {e}");
                }
                if let Some(leased) = next.take() {
                    self.give_back(&leased.records);
                }
                return;
            }
        }
    }

    /// One batch, on demand: lease, publish, delete.
    pub(super) fn sweep(&self) -> Result<usize> {
        let result = self.sweep_once();
        self.count_sweep(result)
    }

    pub(super) fn sweep_once(&self) -> Result<usize> {
        let _one_at_a_time = self.sweeping.lock();
        let publisher = self.publisher()?;
        let leased_at = Instant::now();
        let mut records = self.store.pending(self.options.batch_size)?;
        if records.is_empty() {
            return Ok(0);
        }
        let deadline = self.deadline(leased_at);
        let mut handed = self.hand_over(&publisher, &mut records, deadline);
        let published = self.await_confirms(&records, &mut handed, deadline, None);
        self.finish(&records, published, handed.failures)
    }

    /// A batch leased ahead that waited too long to be handed over (see
    /// [`still_fresh`](Self::still_fresh)): its leases renewed, or, where the store cannot
    /// renew them all, given back and a batch leased afresh (the same records, most often).
    pub(super) fn refresh(&self, l: Leased) -> Result<Leased> {
        let at = Instant::now();
        let ids = ids(&l.records);
        match self.store.renew(&ids) {
            Ok(renewed) if renewed.len() == ids.len() => {
                return Ok(Leased {
                    records: l.records,
                    at,
                })
            }
            Ok(_) => {}
            Err(e) => log::warn!("acemq: renewing the leases of outbox records: {e}"),
        }
        self.give_back(&l.records);
        let at = Instant::now();
        Ok(Leased {
            records: self.store.pending(self.options.batch_size)?,
            at,
        })
    }

    /// The started relay's loop: like [`sweep`](Self::sweep), but pipelined. A full batch is
    /// left in flight (`flying`) while the next one is handed over; then the earlier batch's
    /// confirms are awaited, and — while the broker confirms the new one — the earlier batch is
    /// deleted and the next leased, in one commit where the store can. So the database, the
    /// publishing thread and the broker work at the same time. A batch that is not full, a
    /// record that failed before (it goes alone, after the batch in flight has settled), any
    /// failure and `batch_size(1)` (strict order) settle at once, as `sweep` does. `next`,
    /// `to_delete` and `flying` carry over between calls.
    pub(super) fn pump(
        &self,
        next: &mut Option<Leased>,
        to_delete: &mut Vec<i64>,
        flying: &mut Option<InFlight>,
    ) -> Result<usize> {
        let result = self.pump_once(next, to_delete, flying);
        self.count_sweep(result)
    }

    pub(super) fn pump_once(
        &self,
        next: &mut Option<Leased>,
        to_delete: &mut Vec<i64>,
        flying: &mut Option<InFlight>,
    ) -> Result<usize> {
        let _one_at_a_time = self.sweeping.lock();
        let batch_size = self.options.batch_size;
        // The publisher first, so that nothing is leased that cannot go out; on any error here
        // nothing new goes out and the batch in flight settles (what was leased ahead is given
        // back).
        let publisher_and_records = self.publisher().and_then(|p| {
            let leased = match next.take() {
                Some(l) if self.still_fresh(l.at) => l,
                Some(l) => self.refresh(l)?,
                None => {
                    let at = Instant::now();
                    Leased {
                        records: self.store.pending(batch_size)?,
                        at,
                    }
                }
            };
            Ok((p, leased))
        });
        let (
            publisher,
            Leased {
                mut records,
                at: leased_at,
            },
        ) = match publisher_and_records {
            Ok(got) => got,
            Err(e) => {
                if let Some(leased) = next.take() {
                    self.give_back(&leased.records);
                }
                if let Some(f) = flying.take() {
                    // The sweep's own error is the one returned; what settling the batch in
                    // flight ran into (a delete, a count, a lease not ended) is logged, as the
                    // relay does for every store error it cannot return.
                    if let Err(settling) = self.settle(f, to_delete, None) {
                        log::warn!(
                            "acemq: outbox sweep failed ({e}); settling the batch in flight \
                             then failed too: {settling}"
                        );
                    }
                }
                return Err(e);
            }
        };
        if records.is_empty() || records[0].attempts > 0 || batch_size == 1 {
            // Nothing to overlap with, a failed record that must go alone first, or strict
            // order: the batch in flight settles first, then this one alone. What was confirmed
            // before is deleted first: its leases are not renewed while the batch in flight is
            // awaited.
            let flushed_before = self.flush(to_delete);
            let earlier = match flying.take() {
                Some(f) => self.settle(f, to_delete, None),
                None => Ok(0),
            };
            let flushed = flushed_before.and_then(|()| self.flush(to_delete));
            if let Err(e) = earlier.and_then(|n| flushed.map(|()| n)) {
                self.give_back(&records);
                return Err(e);
            }
            let Leased {
                mut records,
                at: leased_at,
            } = if records.is_empty() || self.still_fresh(leased_at) {
                Leased {
                    records,
                    at: leased_at,
                }
            } else {
                // The batch in flight took long to settle.
                self.refresh(Leased {
                    records,
                    at: leased_at,
                })?
            };
            if records.is_empty() {
                return Ok(0);
            }
            let deadline = self.deadline(leased_at);
            let mut handed = self.hand_over(&publisher, &mut records, deadline);
            let published = self.await_confirms(&records, &mut handed, deadline, None);
            return self.finish(&records, published, handed.failures);
        }
        let mut deadline = self.deadline(leased_at);
        let mut handed = self.hand_over(&publisher, &mut records, deadline);
        let whole = handed.whole_batch && handed.failures.is_empty() && records.len() == batch_size;
        // While the broker confirms the earlier batch and this one: delete what was confirmed
        // before (the batch before the earlier one) and lease the next batch, in one commit
        // where the store can. (Measured here: awaiting the earlier batch first and committing
        // after left the broker idle during the commit; this way the two overlap.)
        let overlap = if whole {
            let at = Instant::now();
            self.store
                .mark_published_and_lease(to_delete, batch_size)
                .map(|records| {
                    to_delete.clear();
                    *next = Some(Leased { records, at });
                })
        } else {
            Ok(())
        };
        // Not full, or the commit failed: what was confirmed before is deleted now, before the
        // batch in flight is awaited (which may take half a lease and more, while the leases
        // of these confirmed records are not renewed).
        let overlap = match overlap {
            Ok(()) if whole => Ok(()),
            Ok(()) => self.flush(to_delete),
            // The commit failed: try the delete alone (what is not deleted stays in
            // `to_delete` for the next commit); the commit's error is the one reported.
            Err(e) => {
                if let Err(deleting) = self.flush(to_delete) {
                    log::warn!(
                        "acemq: deleting published outbox records after a failed commit \
                         ({e}): {deleting}; they are deleted with a later commit"
                    );
                }
                Err(e)
            }
        };
        // The earlier batch has had this batch's hand-over and the commit to be confirmed.
        let handed_ids = ids(&records);
        let earlier = match flying.take() {
            Some(f) => self.settle(f, to_delete, Some((&handed_ids, &mut deadline))),
            None => Ok(0),
        };
        // Unless this batch stays in flight, what the earlier batch had confirmed is deleted now
        // (what was leased ahead is given back below).
        let overlap = match overlap {
            Ok(()) if whole && earlier.is_ok() => Ok(()),
            Ok(()) => self.flush(to_delete),
            Err(e) => Err(e),
        };
        if whole && earlier.is_ok() && overlap.is_ok() {
            *flying = Some(InFlight {
                records,
                handed,
                deadline,
            });
            return Ok(batch_size);
        }
        // Not full, or something failed: this batch settles now, and what was leased ahead is
        // given back.
        let published = self.await_confirms(&records, &mut handed, deadline, None);
        let gave_back = match next.take() {
            Some(leased) => self.store.unlease(&ids(&leased.records)),
            None => Ok(()),
        };
        let n = self.finish(&records, published, handed.failures)?;
        earlier?;
        overlap?;
        gave_back?;
        Ok(n)
    }

    /// Awaits a batch left in flight: all confirmed → its ids join `to_delete` (deleted with the
    /// next commit); otherwise it is finished at once (deleted what went out, failures counted,
    /// leases ended).
    ///
    /// `also`: the batch handed over behind it (its ids and deadline), still in flight while
    /// this one is awaited: its leases are renewed with this batch's (see
    /// [`await_confirms`](Self::await_confirms)), so that they never run out meanwhile.
    pub(super) fn settle(
        &self,
        mut f: InFlight,
        to_delete: &mut Vec<i64>,
        also: Option<(&[i64], &mut Instant)>,
    ) -> Result<usize> {
        let published = self.await_confirms(&f.records, &mut f.handed, f.deadline, also);
        if published.len() == f.records.len() && f.handed.failures.is_empty() {
            let n = published.len();
            to_delete.extend(published);
            return Ok(n);
        }
        self.finish(
            &f.records,
            published,
            std::mem::take(&mut f.handed.failures),
        )
    }

    /// Deletes what was published and confirmed.
    pub(super) fn flush(&self, to_delete: &mut Vec<i64>) -> Result<()> {
        if !to_delete.is_empty() {
            self.store.mark_published_many(to_delete)?;
            to_delete.clear();
        }
        Ok(())
    }
}
