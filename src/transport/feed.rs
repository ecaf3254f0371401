//! [`Feed`]: a buffer a transport fills — a subscription's deliveries, a channel's confirms and
//! returns, a connection's blocked notices — read by the engine's threads and waited on in a
//! crossbeam [`Select`] beside their own channels.
//!
//! A transport hands over its own crossbeam receiver and, where its items are not yet the seam's,
//! the function that makes them so; the conversion runs on the reading thread as each item is
//! read, so no thread and no copy is added between the transport and its reader.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{
    Receiver, RecvError, RecvTimeoutError, Select, SelectedOperation, TryRecvError,
};

/// A transport's buffer of `T`s: cloneable, read by several threads.
pub(crate) struct Feed<T> {
    source: Arc<dyn Source<T>>,
}

impl<T> Clone for Feed<T> {
    fn clone(&self) -> Self {
        Feed {
            source: Arc::clone(&self.source),
        }
    }
}

/// What a feed reads: a receiver of the transport's items and their conversion.
trait Source<T>: Send + Sync {
    fn try_recv(&self) -> Result<T, TryRecvError>;
    fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError>;
    fn recv(&self) -> Result<T, RecvError>;
    fn len(&self) -> usize;
    fn register<'a>(&'a self, select: &mut Select<'a>) -> usize;
    fn read(&self, op: SelectedOperation<'_>) -> Result<T, RecvError>;
}

struct Mapped<A, T> {
    rx: Receiver<A>,
    map: fn(A) -> T,
}

impl<A: Send, T> Source<T> for Mapped<A, T> {
    fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv().map(self.map)
    }
    fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        self.rx.recv_deadline(deadline).map(self.map)
    }
    fn recv(&self) -> Result<T, RecvError> {
        self.rx.recv().map(self.map)
    }
    fn len(&self) -> usize {
        self.rx.len()
    }
    fn register<'a>(&'a self, select: &mut Select<'a>) -> usize {
        select.recv(&self.rx)
    }
    fn read(&self, op: SelectedOperation<'_>) -> Result<T, RecvError> {
        op.recv(&self.rx).map(self.map)
    }
}

impl<T: 'static> Feed<T> {
    /// A feed of the transport's receiver of the seam's own items.
    pub(crate) fn new(rx: Receiver<T>) -> Feed<T>
    where
        T: Send,
    {
        Feed::mapped(rx, |t| t)
    }

    /// A feed of the transport's receiver, each item made the seam's by `map` as it is read.
    pub(crate) fn mapped<A: Send + 'static>(rx: Receiver<A>, map: fn(A) -> T) -> Feed<T> {
        Feed {
            source: Arc::new(Mapped { rx, map }),
        }
    }

    /// A feed that never yields (for a select arm that is switched off).
    pub(crate) fn never() -> Feed<T>
    where
        T: Send,
    {
        Feed::new(crossbeam_channel::never())
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        self.source.try_recv()
    }
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.source.recv_deadline(deadline),
            None => self
                .source
                .recv()
                .map_err(|_| RecvTimeoutError::Disconnected),
        }
    }
    pub(crate) fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        self.source.recv_deadline(deadline)
    }
    /// Every item buffered now.
    #[cfg(test)]
    pub(crate) fn try_iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.try_recv().ok())
    }
    /// Items buffered now.
    pub(crate) fn len(&self) -> usize {
        self.source.len()
    }
    /// Adds a receive of this feed to `select`; its index.
    pub(crate) fn register<'a>(&'a self, select: &mut Select<'a>) -> usize {
        self.source.register(select)
    }
    /// Completes the receive `select` chose (its index was [`register`](Self::register)'s).
    pub(crate) fn read(&self, op: SelectedOperation<'_>) -> Result<T, RecvError> {
        self.source.read(op)
    }
}
