//! One batch: handed to the publisher, its confirms awaited (renewing the leases of a batch
//! whose confirms are slow), then finished: deleted what went out, failures counted, the other
//! leases ended.

use std::time::Instant;

use super::state::{ids, Core};
use crate::error::{Error, Result};
use crate::observe::OutboxEvent;
use crate::patterns::outbox::record::take_message;
use crate::patterns::outbox::store::OutboxRecord;
use crate::publish::Publisher;

/// A batch handed to the publisher.
pub(super) struct HandedOver {
    /// Records published one by one and already confirmed (indexes into the batch).
    pub(super) confirmed: Vec<usize>,
    /// Pipelined publishes awaiting their confirm.
    pub(super) tickets: Vec<(usize, crate::publish::Ticket)>,
    /// The records that failed, and why.
    pub(super) failures: Vec<(usize, Error)>,
    /// Every record of the batch was handed over (none held back behind a failure).
    pub(super) whole_batch: bool,
}

/// How many times the relay renews the leases of a batch whose confirms are slow to come
/// before it gives up on them (see `Core::await_confirms`): with the first half lease, a wait
/// of at most four and a half leases.
const MAX_RENEWALS: u32 = 8;

/// Whether a failed publish is the record's own fault, counted against it: the broker refused
/// (nacked) or could not route this message, or its exchange does not exist. A lost connection
/// or channel, a timeout or a closed publisher says nothing about the record.
fn counts_against_record(e: &Error) -> bool {
    e.is_message_fault()
}

impl Core {
    /// Hands the batch to the publisher: a record that failed before goes alone and is awaited
    /// first; the rest are pipelined, up to the next record that failed before (it goes alone at
    /// the head of a later sweep, so nothing behind it overtakes it).
    ///
    /// Each record handed over gives its body and headers to its message (see
    /// [`take_message`]); what the relay reads of it afterwards (id, attempts, exchange, routing
    /// key, created) stays.
    pub(super) fn hand_over(
        &self,
        publisher: &Publisher,
        records: &mut [OutboxRecord],
        deadline: Instant,
    ) -> HandedOver {
        let mut handed = HandedOver {
            confirmed: Vec::new(),
            tickets: Vec::new(),
            failures: Vec::new(),
            whole_batch: false,
        };
        let mut next = 0;
        while next < records.len() && records[next].attempts > 0 {
            let r = &mut records[next];
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Out of time in this sweep: the rest is given back, still in order.
                return handed;
            }
            let message = take_message(r);
            let sent = publisher
                .publish_deferred(&r.exchange, &r.routing_key, message)
                .and_then(|t| t.wait_timeout(left));
            match sent {
                Ok(()) => {
                    handed.confirmed.push(next);
                    next += 1;
                }
                Err(e) => {
                    handed.failures.push((next, e));
                    return handed;
                }
            }
        }
        for (i, r) in records.iter_mut().enumerate().skip(next) {
            if r.attempts > 0 || Instant::now() >= deadline {
                // A record that failed before waits for a later sweep; past the deadline (a
                // publish waited long for room), the rest is given back, still in order.
                return handed;
            }
            let message = take_message(r);
            match publisher.publish_deferred(&r.exchange, &r.routing_key, message) {
                Ok(t) => handed.tickets.push((i, t)),
                Err(e) => {
                    handed.failures.push((i, e));
                    return handed;
                }
            }
        }
        handed.whole_batch = true;
        handed
    }

    /// Waits for the confirms; returns the ids the broker took, in order.
    ///
    /// At the deadline (half the lease) with confirms still to come — a stalled link — the
    /// leases of the records still awaited are renewed ([`OutboxStore::renew`], only those this
    /// store still holds) and the relay goes on waiting for them, up to `MAX_RENEWALS` times:
    /// giving them back instead would have them published again while the first copies may
    /// still reach the broker. A record whose lease could not be renewed is given up on (a
    /// timeout, not its fault: its lease is ended and it goes out again). The records already
    /// confirmed are renewed with them (they are deleted once the batch settles). The leases of `also`
    /// (another batch in flight meanwhile) are renewed with them, and its deadline moved when
    /// they all were.
    pub(super) fn await_confirms(
        &self,
        records: &[OutboxRecord],
        handed: &mut HandedOver,
        deadline: Instant,
        mut also: Option<(&[i64], &mut Instant)>,
    ) -> Vec<i64> {
        let mut published = Vec::with_capacity(records.len());
        for i in std::mem::take(&mut handed.confirmed) {
            self.published(&records[i]);
            published.push(records[i].id);
        }
        let (mut deadline, mut renewals, started) = (deadline, 0, Instant::now());
        let mut waiting: std::collections::VecDeque<_> = std::mem::take(&mut handed.tickets).into();
        while let Some((i, ticket)) = waiting.pop_front() {
            let ticket = match ticket.wait_or_keep(deadline) {
                Ok(Ok(())) => {
                    self.published(&records[i]);
                    published.push(records[i].id);
                    continue;
                }
                Ok(Err(e)) => {
                    handed.failures.push((i, e));
                    continue;
                }
                Err(ticket) => ticket,
            };
            waiting.push_front((i, ticket));
            // The records still awaited, those of the batch already confirmed (they are
            // deleted only after it settles) and the other batch in flight.
            let mut ids: Vec<i64> = waiting.iter().map(|(i, _)| records[*i].id).collect();
            ids.extend_from_slice(&published);
            if let Some((other, _)) = &also {
                ids.extend_from_slice(other);
            }
            let renewed_at = Instant::now();
            let renewed = if renewals < MAX_RENEWALS {
                self.store.renew(&ids).unwrap_or_else(|e| {
                    log::warn!("acemq: renewing the leases of outbox records in flight: {e}");
                    Vec::new()
                })
            } else {
                Vec::new()
            };
            renewals += 1;
            let (kept, lost): (Vec<_>, Vec<_>) = waiting
                .drain(..)
                .partition(|(i, _)| renewed.contains(&records[*i].id));
            for (i, _) in lost {
                handed.failures.push((
                    i,
                    Error::Timeout {
                        what: format!("the confirm of outbox record {}", records[i].id),
                        after: started.elapsed(),
                    },
                ));
            }
            if !kept.is_empty() {
                log::warn!(
                    "acemq: {} outbox record(s) in flight not confirmed within half their \
                     lease; their leases renewed, the relay goes on waiting",
                    kept.len()
                );
            }
            waiting = kept.into();
            deadline = self.deadline(renewed_at);
            if let Some((other, other_deadline)) = &mut also {
                if other.iter().all(|id| renewed.contains(id)) {
                    **other_deadline = deadline;
                }
            }
        }
        published
    }

    /// Deletes what went out, counts each failure that was its record's own fault (which ends
    /// that record's lease) and ends every other lease of the batch, carrying on past a store
    /// error so that no record the relay did not publish is left leased. Returns the store's
    /// first error, else the first failure counted, else the first failure.
    pub(super) fn finish(
        &self,
        records: &[OutboxRecord],
        published: Vec<i64>,
        mut failures: Vec<(usize, Error)>,
    ) -> Result<usize> {
        // Delete what went out before anything else: a failure below must not lose that.
        let mut store_error = if published.is_empty() {
            None
        } else {
            self.store.mark_published_many(&published).err()
        };
        failures.sort_by_key(|(at, _)| *at);
        let (mut counted, mut first_counted, mut first_other) = (Vec::new(), None, None);
        for (at, e) in failures {
            let r = &records[at];
            if !counts_against_record(&e) {
                log::warn!(
                    "acemq: outbox record {} not published ({e}); it stays in the outbox",
                    r.id
                );
                first_other = first_other.or(Some(e));
                continue;
            }
            let error = e.to_string();
            match self.store.record_failure(r.id, &error) {
                Ok(()) => {
                    counted.push(r.id);
                    self.observer.outbox(&OutboxEvent::Failed {
                        id: r.id,
                        exchange: &r.exchange,
                        routing_key: &r.routing_key,
                        attempts: r.attempts + 1,
                        error: &error,
                    });
                }
                Err(se) => store_error = store_error.or(Some(se)),
            }
            first_counted = first_counted.or(Some(e));
        }
        let unpublished: Vec<i64> = ids(records)
            .into_iter()
            .filter(|id| !published.contains(id) && !counted.contains(id))
            .collect();
        if !unpublished.is_empty() {
            if let Err(e) = self.store.unlease(&unpublished) {
                store_error = store_error.or(Some(e));
            }
        }
        match store_error.or(first_counted).or(first_other) {
            Some(e) => Err(e),
            None => Ok(published.len()),
        }
    }
}
