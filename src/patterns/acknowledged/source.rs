//! Where the batcher takes its items from: the [`Source`] trait, what a poll finds, and a source
//! over an iterator.

use std::time::Duration;

use crate::error::Result;

/// What [`Source::poll`] found.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Polled<I> {
    /// The next item.
    Item(I),
    /// Nothing arrived within the timeout; ask again later.
    Idle,
    /// The source is exhausted: there will be no more items.
    End,
}

/// Where the batcher takes its items from (for the acknowledged consumer: deliveries).
///
/// Runs on the caller's thread only; it need not be `Send`.
pub trait Source {
    /// What it yields, such as a [`Delivery`](super::Delivery).
    type Item;

    /// Waits at most `timeout` for the next item.
    ///
    /// Returns [`Polled::Idle`] if nothing came in time, so that the caller can notice a stop
    /// request while the source is idle. With `Duration::ZERO` it must not block: it returns an
    /// item only if one is ready. [`Polled::End`] means there will be no more; the source is not
    /// polled again after it.
    ///
    /// # Errors
    ///
    /// An error stops the intake; the batcher finishes the items it has taken, closes the source
    /// and returns the error.
    fn poll(&mut self, timeout: Duration) -> Result<Polled<Self::Item>>;

    /// Releases what the source holds (cancels a broker consumer, closes a file). Called exactly
    /// once by the batcher, after the last batch was handed back, on every exit path.
    ///
    /// Defaults to doing nothing.
    ///
    /// # Errors
    ///
    /// Returned by the batcher unless an earlier error is returned instead.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

impl<S: Source + ?Sized> Source for &mut S {
    type Item = S::Item;
    fn poll(&mut self, timeout: Duration) -> Result<Polled<S::Item>> {
        (**self).poll(timeout)
    }
    fn close(&mut self) -> Result<()> {
        (**self).close()
    }
}

impl<S: Source + ?Sized> Source for Box<S> {
    type Item = S::Item;
    fn poll(&mut self, timeout: Duration) -> Result<Polled<S::Item>> {
        (**self).poll(timeout)
    }
    fn close(&mut self) -> Result<()> {
        (**self).close()
    }
}

/// A [`Source`] over an iterator: each item is ready at once, the iterator's end is
/// [`Polled::End`].
#[derive(Clone, Debug)]
pub struct IterSource<It> {
    items: It,
}

impl<It: Iterator> IterSource<It> {
    /// A source yielding `items` in order.
    pub fn new<T: IntoIterator<IntoIter = It>>(items: T) -> IterSource<It> {
        IterSource {
            items: items.into_iter(),
        }
    }
}

impl<It: Iterator> Source for IterSource<It> {
    type Item = It::Item;
    fn poll(&mut self, _timeout: Duration) -> Result<Polled<It::Item>> {
        Ok(self.items.next().map_or(Polled::End, Polled::Item))
    }
}
