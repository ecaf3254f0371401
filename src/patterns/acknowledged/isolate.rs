//! Applying a batch so that one message that fails, fails alone: the batch in one transaction,
//! then, when it rolled back, its messages one at a time.

use super::delivery::Delivery;
use super::store_apply::{ApplyBatch, Message, Receipt};
use crate::error::{Error, Result};

/// True when the store refused the message itself: it fails the same way every time it is
/// applied, whether the database is up or down.
fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidArgument { .. }
            | Error::InvalidName { .. }
            | Error::InvalidHeader { .. }
            | Error::Codec { .. }
    )
}

/// What became of one message of a batch on the worker.
pub(super) enum Applied {
    /// Committed: with its batch, or alone after the batch rolled back.
    Committed(Receipt),
    /// Failed alone through its own fault (see [`Acknowledge::rejected`]).
    Rejected(Error),
    /// Rolled back, and nothing says it was its own fault: a batch of one that failed with a
    /// database error, or a batch the store failed as if it were down.
    RolledBack(std::sync::Arc<Error>),
}

/// [`ApplyBatch::apply_batch`], with a panic of the effect turned into its batch's error (the
/// store's transaction is rolled back as the panic unwinds), so that a message whose effect
/// panics fails alone like any other.
fn apply_caught<St: ApplyBatch + ?Sized>(
    store: &St,
    messages: &[&Message],
) -> Result<Vec<Receipt>> {
    caught("the effect", || store.apply_batch(messages))
}

/// `call`'s result, or its panic as an error (`what` panicked).
fn caught<R>(what: &str, call: impl FnOnce() -> Result<R>) -> Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|panic| {
        Err(Error::Handler {
            source: format!("{what} panicked: {}", crate::error::panic_message(&*panic)).into(),
        })
    })
}

/// Messages tried alone after a rolled-back batch that fail with something other than a
/// refusal, with none committed, before the store is taken to be down and the rest of the batch
/// is not tried.
const DOWN_AFTER: usize = 2;

/// Applies a batch in one transaction; when it rolls back (and it held more than one message),
/// applies its messages again one at a time, so that one message that cannot be applied fails
/// alone and its batchmates commit. The second pass stops early when the first messages tried
/// all fail without a refusal and none commits, unless the store says it is up
/// ([`ApplyBatch::check_up`]): down, trying every message of the batch would only make an
/// outage longer. A failure is the message's own ([`Applied::Rejected`]) when it is a refusal,
/// when a batchmate committed, or when the store says it is up.
pub(super) fn apply_isolating<T, St: ApplyBatch + ?Sized>(
    store: &St,
    batch: &[Delivery<T>],
) -> Vec<Applied> {
    let messages: Vec<&Message> = batch.iter().map(|d| &d.message).collect();
    let batch_error = match apply_caught(store, &messages) {
        Ok(receipts) => return receipts.into_iter().map(Applied::Committed).collect(),
        Err(e) => e,
    };
    if messages.len() == 1 {
        return vec![
            if is_refusal(&batch_error) || store_is_up(store, &batch_error) {
                Applied::Rejected(batch_error)
            } else {
                Applied::RolledBack(std::sync::Arc::new(batch_error))
            },
        ];
    }
    log::debug!(
        "acknowledged consumer: a batch of {} rolled back ({batch_error}); applying its messages \
         one at a time",
        messages.len()
    );
    let batch_error = std::sync::Arc::new(batch_error);
    // `up`: asked of the store at most once, when messages failed unexplained and none
    // committed.
    let (mut committed, mut unexplained, mut up) = (false, 0, None);
    let mut each = Vec::with_capacity(messages.len());
    for m in &messages {
        if !committed
            && unexplained >= DOWN_AFTER
            && !*up.get_or_insert_with(|| store_is_up(store, &batch_error))
        {
            each.push(None);
            continue;
        }
        let alone = apply_caught(store, std::slice::from_ref(m)).and_then(|r| {
            r.into_iter()
                .next()
                .ok_or_else(|| Error::invalid("the store returned no receipt for a message"))
        });
        match &alone {
            Ok(_) => committed = true,
            Err(e) if !is_refusal(e) => unexplained += 1,
            Err(_) => {}
        }
        each.push(Some(alone));
    }
    let own_fault = committed
        || (unexplained > 0 && *up.get_or_insert_with(|| store_is_up(store, &batch_error)));
    each.into_iter()
        .map(|alone| match alone {
            Some(Ok(receipt)) => Applied::Committed(receipt),
            Some(Err(e)) if own_fault || is_refusal(&e) => Applied::Rejected(e),
            Some(Err(e)) => Applied::RolledBack(std::sync::Arc::new(e)),
            None => Applied::RolledBack(batch_error.clone()),
        })
        .collect()
}

/// The store's answer to [`ApplyBatch::check_up`] after `failure` (a panic in it counts as
/// down).
fn store_is_up<St: ApplyBatch + ?Sized>(store: &St, failure: &Error) -> bool {
    match caught("the store's check", || store.check_up()) {
        Ok(()) => {
            log::debug!(
                "acknowledged consumer: the store commits, so this failure is the message's \
                 own: {failure}"
            );
            true
        }
        Err(e) => {
            log::debug!(
                "acknowledged consumer: the store is not up ({e}); treating this failure as an \
                 outage: {failure}"
            );
            false
        }
    }
}
