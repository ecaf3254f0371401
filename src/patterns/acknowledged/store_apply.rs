//! What a store applies and returns: the broker-neutral [`Message`], its [`Receipt`], and the
//! [`ApplyBatch`] seam the acknowledged consumer commits batches through.

use std::fmt;

use crate::error::{Error, Result};

/// A message as the acknowledged consumer sees it: an immutable identity and a payload.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Message {
    /// The business identity: the same on every replay, scoped by its source, topic, tenant or
    /// operation (the receipt table is one namespace). Must not be empty.
    pub identifier: String,
    /// The payload, as bytes. Its SHA-256 is recorded with the receipt.
    pub payload: Vec<u8>,
}

impl Message {
    /// A message with this identity and payload.
    pub fn new(identifier: impl Into<String>, payload: impl Into<Vec<u8>>) -> Message {
        Message {
            identifier: identifier.into(),
            payload: payload.into(),
        }
    }
}

impl fmt::Debug for Message {
    /// Shows the identifier and the payload's length, never the payload.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("identifier", &self.identifier)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// What a store did with one message of a committed batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Receipt {
    /// New: the effect ran and its receipt was written in the batch's transaction.
    Applied {
        /// The effect's outcome, as recorded.
        outcome: String,
    },
    /// A replay of an identity already done (in an earlier batch, or earlier in this one) with
    /// the same payload: nothing ran; this is the earlier outcome.
    Replayed {
        /// The outcome recorded when it was applied.
        outcome: String,
    },
}

impl Receipt {
    /// The outcome recorded with the receipt.
    pub fn outcome(&self) -> &str {
        match self {
            Receipt::Applied { outcome } | Receipt::Replayed { outcome } => outcome,
        }
    }

    /// True for [`Receipt::Replayed`].
    pub fn is_replay(&self) -> bool {
        matches!(self, Receipt::Replayed { .. })
    }
}

/// A store that applies a batch of messages all or nothing: one [`Receipt`] per message, in
/// order, after its transaction committed.
///
/// Implemented by [`BatchStore`](super::BatchStore) and [`CounterStore`](super::CounterStore). `Sync` because the batch runs on the
/// batcher's worker thread while the caller's thread keeps a reference.
pub trait ApplyBatch: Sync {
    /// Applies `messages` in one transaction and returns one receipt per message, in order,
    /// once it has committed.
    ///
    /// # Errors
    ///
    /// Any error means the whole batch was rolled back (nothing of it stays).
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>>;

    /// Whether the store can commit a transaction now: `Ok` if it can. Asked (at most once per
    /// batch) when messages failed alone with errors that are not refusals and none of the
    /// batch committed — the one case where a message's own failure and an outage look alike.
    /// `Ok` makes the failures the messages' own ([`Acknowledge::rejected`](super::Acknowledge::rejected): counted towards
    /// a dead letter); an error keeps them an outage (nothing rejected).
    ///
    /// Defaults to an error (the store cannot tell): such failures are treated as an outage,
    /// and a message that always fails that way alone is retried, never dead-lettered.
    /// [`BatchStore`](super::BatchStore) and [`CounterStore`](super::CounterStore) check by committing an empty transaction.
    ///
    /// # Errors
    ///
    /// The reason the store cannot commit now (or cannot tell).
    fn check_up(&self) -> Result<()> {
        Err(Error::invalid(
            "this store cannot tell whether it is up (ApplyBatch::check_up not implemented)",
        ))
    }
}

impl<S: ApplyBatch + ?Sized> ApplyBatch for &S {
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
        (**self).apply_batch(messages)
    }
    fn check_up(&self) -> Result<()> {
        (**self).check_up()
    }
}

impl<S: ApplyBatch + ?Sized + Send> ApplyBatch for std::sync::Arc<S> {
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
        (**self).apply_batch(messages)
    }
    fn check_up(&self) -> Result<()> {
        (**self).check_up()
    }
}
