//! The data a batch publish reports ([`BatchReport`], [`BatchItem`], [`BatchOutcome`]), here in
//! the base layer because [`Error::Batch`](crate::Error::Batch) carries it; its one public path
//! is the crate root, beside [`Publisher::publish_all`](crate::Publisher::publish_all), which
//! makes it.

use std::fmt;

/// What became of one message of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchOutcome {
    /// The broker confirmed it (`basic.ack`), and it was routed.
    Confirmed,
    /// The broker refused it (`basic.nack`): a queue at its `x-max-length` with
    /// `x-overflow: reject-publish`, say. Retriable, as [`Error::Nacked`](crate::Error::Nacked).
    Nacked,
    /// Published mandatory and returned: no queue is bound for it (`basic.return`), as
    /// [`Error::Unroutable`](crate::Error::Unroutable). Not retriable as it is.
    Unroutable {
        /// The broker's reply code (312 NO_ROUTE).
        reply_code: u16,
        /// The broker's reply text.
        reply_text: String,
    },
    /// Handed over, but no confirm came: the publisher's timeout passed, or the channel or
    /// connection went away first. It may or may not have reached a queue: resending it may
    /// duplicate it.
    Lost {
        /// Why, as the error [`Ticket::wait`](crate::Ticket::wait) would have returned.
        reason: String,
        /// Whether resending it as it is may succeed (false when the broker closed the channel
        /// over it: a missing exchange).
        retriable: bool,
    },
    /// Never handed over: no room in the window or the connection's byte budget in time, the
    /// connection did not come back, the publisher was closed, a publish interceptor refused
    /// it, or the batch stopped handing over at an earlier message that failed so. Resending
    /// it cannot duplicate it.
    NotSent {
        /// Why, as the error [`Publisher::publish_deferred`](crate::Publisher::publish_deferred)
        /// would have returned (or which earlier message stopped the batch).
        reason: String,
        /// Whether resending it as it is may succeed.
        retriable: bool,
    },
}

impl BatchOutcome {
    /// `confirmed`, `nacked`, `unroutable`, `lost` or `not_sent`.
    pub fn as_str(&self) -> &'static str {
        match self {
            BatchOutcome::Confirmed => "confirmed",
            BatchOutcome::Nacked => "nacked",
            BatchOutcome::Unroutable { .. } => "unroutable",
            BatchOutcome::Lost { .. } => "lost",
            BatchOutcome::NotSent { .. } => "not_sent",
        }
    }

    /// True for [`Confirmed`](Self::Confirmed).
    pub fn is_confirmed(&self) -> bool {
        matches!(self, BatchOutcome::Confirmed)
    }

    /// True when resending the message as it is may succeed: nacked, and lost or not sent for
    /// a reason that is not the message's own. False for confirmed and unroutable.
    pub fn is_retriable(&self) -> bool {
        match self {
            BatchOutcome::Confirmed | BatchOutcome::Unroutable { .. } => false,
            BatchOutcome::Nacked => true,
            BatchOutcome::Lost { retriable, .. } | BatchOutcome::NotSent { retriable, .. } => {
                *retriable
            }
        }
    }
}

impl fmt::Display for BatchOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchOutcome::Confirmed | BatchOutcome::Nacked => f.write_str(self.as_str()),
            BatchOutcome::Unroutable {
                reply_code,
                reply_text,
            } => write!(f, "unroutable ({reply_code} {reply_text})"),
            BatchOutcome::Lost { reason, .. } => write!(f, "lost: {reason}"),
            BatchOutcome::NotSent { reason, .. } => write!(f, "not sent: {reason}"),
        }
    }
}

/// One message of a batch: where it was in the input, its id, and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchItem {
    /// Its position in the batch as given (0-based).
    pub index: usize,
    /// Its message id (`x-acemq-id`, the AMQP `message_id`), as published.
    pub message_id: String,
    /// What became of it.
    pub outcome: BatchOutcome,
}

/// What a [`Publisher::publish_all`](crate::Publisher::publish_all) did with each message, in
/// the order the messages were given, with counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// One per message, in input order (`items[i].index == i`).
    pub items: Vec<BatchItem>,
}

impl BatchReport {
    pub(crate) fn new(items: Vec<BatchItem>) -> BatchReport {
        BatchReport { items }
    }

    /// How many messages the batch had.
    pub fn total(&self) -> usize {
        self.items.len()
    }

    /// How many the broker confirmed.
    pub fn confirmed(&self) -> usize {
        self.count(|o| matches!(o, BatchOutcome::Confirmed))
    }

    /// How many the broker nacked.
    pub fn nacked(&self) -> usize {
        self.count(|o| matches!(o, BatchOutcome::Nacked))
    }

    /// How many came back unroutable.
    pub fn unroutable(&self) -> usize {
        self.count(|o| matches!(o, BatchOutcome::Unroutable { .. }))
    }

    /// How many were handed over without a confirm.
    pub fn lost(&self) -> usize {
        self.count(|o| matches!(o, BatchOutcome::Lost { .. }))
    }

    /// How many were never handed over.
    pub fn not_sent(&self) -> usize {
        self.count(|o| matches!(o, BatchOutcome::NotSent { .. }))
    }

    /// How many were not confirmed (`total() - confirmed()`).
    pub fn failed(&self) -> usize {
        self.total() - self.confirmed()
    }

    /// True when every message was confirmed (an empty batch included).
    pub fn all_confirmed(&self) -> bool {
        self.items.iter().all(|i| i.outcome.is_confirmed())
    }

    /// The messages not confirmed, in input order: the ones to look at or resend.
    pub fn unconfirmed(&self) -> impl Iterator<Item = &BatchItem> {
        self.items.iter().filter(|i| !i.outcome.is_confirmed())
    }

    /// True when some message was not confirmed and every such one may succeed if resent
    /// ([`BatchOutcome::is_retriable`]): none unroutable, none refused for itself.
    pub fn is_retriable(&self) -> bool {
        let mut unconfirmed = self.unconfirmed().peekable();
        unconfirmed.peek().is_some() && unconfirmed.all(|i| i.outcome.is_retriable())
    }

    fn count(&self, which: impl Fn(&BatchOutcome) -> bool) -> usize {
        self.items.iter().filter(|i| which(&i.outcome)).count()
    }
}

impl fmt::Display for BatchReport {
    /// `2 of 5 messages not confirmed (3 confirmed, 1 nacked, 1 unroutable, 0 lost, 0 not
    /// sent); the first: message 1 "id": nacked`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} messages not confirmed ({} confirmed, {} nacked, {} unroutable, {} lost, \
             {} not sent)",
            self.failed(),
            self.total(),
            self.confirmed(),
            self.nacked(),
            self.unroutable(),
            self.lost(),
            self.not_sent()
        )?;
        if let Some(first) = self.unconfirmed().next() {
            write!(
                f,
                "; the first: message {} {:?}: {}",
                first.index, first.message_id, first.outcome
            )?;
        }
        Ok(())
    }
}

/// [`Error::InvalidBatch`](crate::Error::InvalidBatch)'s text.
pub(crate) fn write_refused(
    f: &mut fmt::Formatter<'_>,
    index: usize,
    source: &dyn fmt::Display,
) -> fmt::Result {
    write!(
        f,
        "batch refused at message {index}, nothing sent: {source}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(index: usize, outcome: BatchOutcome) -> BatchItem {
        BatchItem {
            index,
            message_id: format!("m{index}"),
            outcome,
        }
    }

    #[test]
    fn counts_and_text_name_each_outcome() {
        let report = BatchReport::new(vec![
            item(0, BatchOutcome::Confirmed),
            item(1, BatchOutcome::Nacked),
            item(
                2,
                BatchOutcome::Unroutable {
                    reply_code: 312,
                    reply_text: "NO_ROUTE".into(),
                },
            ),
            item(
                3,
                BatchOutcome::Lost {
                    reason: "gone".into(),
                    retriable: true,
                },
            ),
        ]);
        assert_eq!(
            (report.total(), report.confirmed(), report.failed()),
            (4, 1, 3)
        );
        assert_eq!(
            (report.nacked(), report.unroutable(), report.lost()),
            (1, 1, 1)
        );
        assert!(!report.all_confirmed());
        assert!(!report.is_retriable(), "an unroutable one is not");
        let unconfirmed: Vec<usize> = report.unconfirmed().map(|i| i.index).collect();
        assert_eq!(unconfirmed, [1, 2, 3]);
        assert_eq!(
            report.to_string(),
            "3 of 4 messages not confirmed (1 confirmed, 1 nacked, 1 unroutable, 1 lost, 0 not \
             sent); the first: message 1 \"m1\": nacked"
        );
    }

    #[test]
    fn nacked_and_lost_alone_are_retriable_and_an_empty_batch_is_complete() {
        let report = BatchReport::new(vec![
            item(0, BatchOutcome::Nacked),
            item(
                1,
                BatchOutcome::NotSent {
                    reason: "timed out".into(),
                    retriable: true,
                },
            ),
        ]);
        assert!(report.is_retriable());
        let empty = BatchReport::default();
        assert!(empty.all_confirmed());
        assert!(!empty.is_retriable());
        assert_eq!(empty.total(), 0);
    }
}
