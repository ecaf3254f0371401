//! The answer to one publish, waited for later. In the base layer (it names only errors and
//! the trace's span), so that the publish interceptors' trait (`intercept.rs`), which returns
//! one, can be held typed by the connection's options; made and answered by `publish/`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The answer to one publish, to wait for later.
#[must_use = "a ticket must be waited on to know whether the broker took the message"]
#[derive(Debug)]
pub struct Ticket {
    pub(crate) reply: oneshot::Receiver<Result<()>>,
    pub(crate) message_id: String,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    /// The publish's span (feature `opentelemetry`), ended with the answer.
    pub(crate) span: crate::trace::PublishSpan,
    /// The connection's blocked state, to report a timeout while blocked as such.
    pub(crate) blocked: Arc<parking_lot::Mutex<Option<String>>>,
}

impl Ticket {
    /// The published message's id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Waits for the broker's answer, up to the publisher's timeout counted from the publish.
    ///
    /// # Errors
    ///
    /// [`Error::Nacked`], [`Error::Unroutable`], [`Error::ConnectionLost`] (retriable),
    /// [`Error::Timeout`] ([`Error::Blocked`] when the broker is blocking publishing then).
    pub fn wait(self) -> Result<()> {
        let deadline = self.deadline;
        self.wait_deadline(deadline)
    }

    /// Waits up to `timeout` from now.
    ///
    /// # Errors
    ///
    /// As [`wait`](Self::wait).
    pub fn wait_timeout(self, timeout: Duration) -> Result<()> {
        self.wait_deadline(Instant::now() + timeout)
    }

    /// The answer if it has come, without waiting.
    pub fn try_wait(&self) -> Option<Result<()>> {
        self.reply.try_recv().ok()
    }

    fn wait_deadline(mut self, deadline: Instant) -> Result<()> {
        let result = self
            .answer(deadline)
            .map_err(|e| blocked_or(&self.blocked, e));
        self.span.end(result.as_ref().map(|_| ()));
        result
    }

    /// Waits up to `deadline`; when no answer came by then, hands the ticket back (to go on
    /// waiting, as the outbox relay does once it has renewed its lease) instead of a timeout.
    pub(crate) fn wait_or_keep(
        mut self,
        deadline: Instant,
    ) -> std::result::Result<Result<()>, Ticket> {
        match self.reply.recv_deadline(deadline) {
            Err(oneshot::RecvTimeoutError::Timeout) => Err(self),
            Ok(r) => {
                let r = r.map_err(|e| blocked_or(&self.blocked, e));
                self.span.end(r.as_ref().map(|_| ()));
                Ok(r)
            }
            Err(oneshot::RecvTimeoutError::Disconnected) => {
                let r = Err(Error::Closed { what: "publisher" });
                self.span.end(r.as_ref().map(|_| ()));
                Ok(r)
            }
        }
    }

    fn answer(&self, deadline: Instant) -> Result<()> {
        match self.reply.recv_deadline(deadline) {
            Ok(r) => r,
            Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout {
                what: format!("the confirm of message {:?}", self.message_id),
                after: self.timeout,
            }),
            Err(oneshot::RecvTimeoutError::Disconnected) => {
                Err(Error::Closed { what: "publisher" })
            }
        }
    }
}

/// A timeout while the broker blocks publishing is reported as [`Error::Blocked`].
pub(crate) fn blocked_or(blocked: &parking_lot::Mutex<Option<String>>, e: Error) -> Error {
    match e {
        Error::Timeout { after, .. } => match blocked.lock().clone() {
            Some(reason) => Error::Blocked { reason, after },
            None => e,
        },
        e => e,
    }
}
