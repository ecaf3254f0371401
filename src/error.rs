//! The crate's one error type.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::observe::batch_report::write_refused;
use crate::wire::AmqpError;

/// A boxed error from a handler, a codec or a database driver.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in this crate.
///
/// Each variant carries the context needed to act on it (which queue, which header, which
/// address) and, where another library failed, that library's error as [`source()`].
/// Passwords never appear in any of them.
///
/// [`source()`]: std::error::Error::source
#[non_exhaustive]
#[derive(Debug)]
pub enum Error {
    /// Could not open a connection to any configured address.
    Connect {
        /// The address tried last, without its password.
        address: String,
        /// What failed.
        source: BoxError,
    },
    /// The connection to the broker dropped (or was never up) while the operation was under way.
    /// Retriable: the connection recovers by itself.
    ConnectionLost {
        /// What was being done.
        context: String,
    },
    /// The connection, publisher or consumer was closed by its owner.
    Closed {
        /// What was closed.
        what: &'static str,
    },
    /// An AMQP operation failed.
    Amqp {
        /// What was being done.
        context: String,
        /// What the transport answered (boxed: it is large).
        source: Box<AmqpError>,
    },
    /// A declaration conflicts with what exists on the broker (AMQP 406 PRECONDITION_FAILED),
    /// for example a queue declared with a different `x-message-ttl`.
    TopologyConflict {
        /// `"queue"` or `"exchange"`.
        kind: &'static str,
        /// The queue or exchange.
        name: String,
        /// The broker's reason, which names the argument.
        reason: String,
    },
    /// A passive check or an operation found no such queue or exchange (AMQP 404).
    NotFound {
        /// `"queue"` or `"exchange"`.
        kind: &'static str,
        /// The queue or exchange.
        name: String,
        /// The broker's reason.
        reason: String,
    },
    /// The broker refused a publish (`basic.nack`).
    Nacked {
        /// The message's id.
        message_id: String,
    },
    /// A mandatory publish could not be routed to any queue (`basic.return`).
    Unroutable {
        /// The exchange it was published to.
        exchange: String,
        /// Its routing key.
        routing_key: String,
        /// The message's id.
        message_id: String,
        /// The broker's reply code (312 NO_ROUTE).
        reply_code: u16,
        /// The broker's reply text.
        reply_text: String,
    },
    /// Waiting for an answer took longer than allowed.
    Timeout {
        /// What was awaited.
        what: String,
        /// How long was waited.
        after: Duration,
    },
    /// A header name or value cannot be sent as given.
    InvalidHeader {
        /// The header.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// A message's header frame — its AMQP properties and header table, which amiquip sends as
    /// one frame (a body is split across frames, a header is not) — is larger than the
    /// connection's frame limit ([`Connection::frame_max`](crate::Connection::frame_max)).
    /// Refused before anything is sent: sent, RabbitMQ would close the whole connection. A
    /// fault of the message ([`is_message_fault`](Self::is_message_fault)), never retriable as
    /// it is: shrink its headers (or raise
    /// [`ConnectionOptions::frame_max`](crate::ConnectionOptions::frame_max) where the broker
    /// allows it).
    FrameTooLarge {
        /// The message's id.
        message_id: String,
        /// The header frame's encoded size, in bytes.
        size: usize,
        /// The frame limit, in bytes.
        limit: usize,
    },
    /// A name (queue, exchange, routing key, table, consumer tag, …) is refused.
    InvalidName {
        /// What kind of name.
        kind: &'static str,
        /// The name, as given (truncated if long).
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// An option or argument is out of range or inconsistent.
    InvalidArgument {
        /// What is wrong.
        reason: String,
    },
    /// A codec could not encode or decode a payload.
    Codec {
        /// The content type involved.
        content_type: String,
        /// The codec's error.
        source: BoxError,
    },
    /// A database operation failed. Its text follows a PostgreSQL error to its cause: the
    /// server's severity, SQLSTATE code and message (`ERROR 42P01: relation "t" does not
    /// exist`), or the I/O error (`error connecting to server: Connection refused …`).
    Sql {
        /// What was being done.
        context: String,
        /// The driver's error.
        source: BoxError,
    },
    /// No schema with that id or subject is registered.
    SchemaNotFound {
        /// The id or subject looked up.
        what: String,
    },
    /// An I/O operation failed.
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The broker cancelled a consumer (its queue was deleted).
    Cancelled {
        /// The queue.
        queue: String,
    },
    /// A handler failed.
    Handler {
        /// The handler's error.
        source: BoxError,
    },
    /// A responder answered a request with a failure (the reply's `acemq-error` header).
    Responder {
        /// The responder's error text.
        message: String,
    },
    /// No reply to a request arrived in time. Retriable, but the request may still be handled
    /// (and its reply, arriving late, is dropped and counted as unmatched).
    RequestTimeout {
        /// Where the request was sent.
        routing_key: String,
        /// The request's correlation id (`x-acemq-correlation`).
        correlation_id: String,
        /// How long was waited.
        after: Duration,
    },
    /// A dead-letter replay pass stopped on a failure; what it had done by then is in `report`
    /// (the message being moved and every held one are back on the source queue).
    Replay {
        /// What the pass did before it stopped.
        report: Box<crate::observe::replay_report::ReplayReport>,
        /// Why it stopped.
        source: Box<Error>,
    },
    /// A stream handler asked for a retry (or failed with an error, or panicked), which a
    /// stream cannot do: republishing onto the stream would append a second copy to the log
    /// for every reader. The message is parked on `{stream}.parked` with this text instead.
    StreamRetry {
        /// The stream.
        stream: String,
        /// Where in the stream the message sits (`x-stream-offset`), when the delivery said.
        offset: Option<u64>,
        /// The message's id.
        message_id: String,
        /// Why the handler wanted a retry.
        reason: String,
    },
    /// The broker login could not be read from where it was configured to come from (an
    /// environment variable unset, a credentials file missing, empty or without a username).
    /// Never holds the secret.
    Credentials {
        /// What is wrong.
        reason: String,
    },
    /// The broker blocked publishing (`connection.blocked`: a memory or disk alarm) and the
    /// publish could not go out within its timeout. Retriable: it goes through once the alarm
    /// clears.
    Blocked {
        /// What the broker said.
        reason: String,
        /// How long was waited.
        after: Duration,
    },
    /// Not all of a [`Publisher::publish_all`](crate::Publisher::publish_all) was confirmed.
    Batch {
        /// What became of each message, in input order: which to resend.
        report: Box<crate::observe::batch_report::BatchReport>,
    },
    /// A message of a batch is invalid: the whole batch is refused before anything is sent.
    InvalidBatch {
        /// The message's position in the batch (0-based).
        index: usize,
        /// Why it is refused.
        source: Box<Error>,
    },
}

impl Error {
    /// True when trying the same operation again later may succeed as it is: the connection
    /// dropped, an answer timed out, or the broker nacked a publish (a full queue, say).
    ///
    /// Whose fault a failure is, is a separate question: see
    /// [`is_message_fault`](Self::is_message_fault). A nack is both.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            Error::ConnectionLost { .. }
                | Error::Connect { .. }
                | Error::Timeout { .. }
                | Error::RequestTimeout { .. }
                | Error::Nacked { .. }
                | Error::Blocked { .. }
        ) || matches!(self, Error::Amqp { source, .. } if amqp_is_retriable(source))
            || matches!(self, Error::Batch { report } if report.is_retriable())
    }

    /// True when the failure is about this message or operation — the broker refused it
    /// (nacked, unroutable, no such exchange or queue, a conflicting declaration) or it was
    /// invalid — rather than the connection's (dropped, timed out, closed). The outbox relay
    /// counts exactly these failures against a record, so a record the broker keeps refusing
    /// retires while a connection outage costs nothing.
    pub fn is_message_fault(&self) -> bool {
        !matches!(
            self,
            Error::ConnectionLost { .. }
                | Error::Connect { .. }
                | Error::Timeout { .. }
                | Error::RequestTimeout { .. }
                | Error::Closed { .. }
                | Error::Blocked { .. }
                | Error::Credentials { .. }
        ) && !matches!(self, Error::Amqp { source, .. } if amqp_is_retriable(source))
            && !matches!(self, Error::Batch { report } if report.is_retriable())
    }

    /// A transport's error from `doing` on the `kind` named `name`, with the broker's refusals
    /// named: 404 is [`Error::NotFound`], 406 [`Error::TopologyConflict`]; everything else keeps
    /// its context. The one place these codes are read.
    pub(crate) fn from_amqp_on(kind: &'static str, name: &str, doing: &str, e: AmqpError) -> Error {
        match e {
            AmqpError::ServerClosedChannel { code: 404, message } => Error::NotFound {
                kind,
                name: name.to_string(),
                reason: message,
            },
            AmqpError::ServerClosedChannel { code: 406, message } => Error::TopologyConflict {
                kind,
                name: name.to_string(),
                reason: message,
            },
            e => Error::amqp(format!("{doing} {kind} {name:?}"), e),
        }
    }

    /// True when a mandatory publish was returned as unroutable.
    pub fn is_unroutable(&self) -> bool {
        matches!(self, Error::Unroutable { .. })
    }

    /// True when a wait timed out (a publish held back by a blocked broker, [`Error::Blocked`],
    /// included).
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::RequestTimeout { .. } | Error::Blocked { .. }
        )
    }

    /// True when a declaration conflicted with the broker's existing topology.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::TopologyConflict { .. })
    }

    /// True when the connection dropped under the operation.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Error::ConnectionLost { .. })
    }

    pub(crate) fn amqp(context: impl Into<String>, source: AmqpError) -> Error {
        let context = context.into();
        match source {
            AmqpError::LinkLost { .. }
            | AmqpError::ServerClosedConnection { .. }
            | AmqpError::ClientClosedConnection => Error::ConnectionLost { context },
            source => Error::Amqp {
                context,
                source: Box::new(source),
            },
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            reason: reason.into(),
        }
    }

    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )] // the SQL seam's
    pub(crate) fn sql(context: impl Into<String>, source: impl Into<BoxError>) -> Error {
        Error::Sql {
            context: context.into(),
            source: source.into(),
        }
    }
}

#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for Error {
    /// [`Error::Sql`] with the driver's error as its source, for a connections factory or
    /// handler written with `?`.
    fn from(e: rusqlite::Error) -> Error {
        Error::sql("calling SQLite", e)
    }
}

#[cfg(feature = "postgres")]
impl From<postgres::Error> for Error {
    /// [`Error::Sql`] with the driver's error as its source, for a connections factory or
    /// handler written with `?`.
    fn from(e: postgres::Error) -> Error {
        Error::sql("calling PostgreSQL", e)
    }
}

#[cfg(feature = "mysql")]
impl From<mysql::Error> for Error {
    /// [`Error::Sql`] with the driver's error as its source, for a connections factory or
    /// handler written with `?`.
    fn from(e: mysql::Error) -> Error {
        Error::sql("calling MySQL", e)
    }
}

/// A database driver's error as `Error::Sql` prints it: its own text, except that a PostgreSQL
/// error (whose text is only "db error" or "error connecting to server") is followed by its
/// causes — the server's severity, SQLSTATE code and message (with its detail and hint), or the
/// I/O error (`Connection refused`).
fn write_sql_source(f: &mut fmt::Formatter<'_>, source: &(dyn StdError + 'static)) -> fmt::Result {
    #[cfg(feature = "postgres")]
    if let Some(e) = source.downcast_ref::<postgres::Error>() {
        return write_postgres_error(f, e);
    }
    write!(f, "{source}")
}

/// `e` and its causes, one after another (`error connecting to server: Connection refused (os
/// error 111)`); a server's error replaces the driver's "db error" (`ERROR 42P01: relation "t"
/// does not exist`).
#[cfg(feature = "postgres")]
fn write_postgres_error(f: &mut fmt::Formatter<'_>, e: &postgres::Error) -> fmt::Result {
    let mut written = false;
    if e.as_db_error().is_none() {
        write!(f, "{e}")?;
        written = true;
    }
    let mut cause = e.source();
    while let Some(c) = cause {
        if written {
            f.write_str(": ")?;
        }
        match c.downcast_ref::<postgres::error::DbError>() {
            Some(db) => {
                write!(
                    f,
                    "{} {}: {}",
                    db.severity(),
                    db.code().code(),
                    db.message()
                )?;
                if let Some(detail) = db.detail() {
                    write!(f, " (detail: {detail})")?;
                }
                if let Some(hint) = db.hint() {
                    write!(f, " (hint: {hint})")?;
                }
            }
            None => write!(f, "{c}")?,
        }
        written = true;
        cause = c.source();
    }
    if !written {
        write!(f, "{e}")?;
    }
    Ok(())
}

/// The text of a caught panic's payload: the message of `panic!("…")` (a `&str` or a
/// `String`), else a placeholder. One wording for every place that turns a panic into an error
/// (a handler's retry reason, a failed batch of the acknowledged consumer).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a non-string payload"
    }
}

fn amqp_is_retriable(e: &AmqpError) -> bool {
    matches!(
        e,
        AmqpError::LinkLost { .. } | AmqpError::ServerClosedConnection { .. }
    )
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connect { address, source } => {
                write!(f, "could not connect to {address}: {source}")
            }
            Error::ConnectionLost { context } => {
                write!(f, "connection to the broker lost while {context}")
            }
            Error::Closed { what } => write!(f, "{what} is closed"),
            Error::Amqp { context, source } => write!(f, "{context}: {source}"),
            Error::TopologyConflict { kind, name, reason } => write!(
                f,
                "{kind} {name:?} exists with different settings: {reason}"
            ),
            Error::NotFound { kind, name, reason } => {
                write!(f, "{kind} {name:?} not found: {reason}")
            }
            Error::Nacked { message_id } => {
                write!(f, "the broker refused (nacked) message {message_id:?}")
            }
            Error::Unroutable {
                exchange,
                routing_key,
                message_id,
                reply_code,
                reply_text,
            } => write!(
                f,
                "message {message_id:?} to exchange {exchange:?} with routing key \
                 {routing_key:?} is unroutable ({reply_code} {reply_text})"
            ),
            Error::Timeout { what, after } => {
                write!(f, "timed out after {after:?} waiting for {what}")
            }
            Error::InvalidHeader { name, reason } => write!(f, "header {name:?} refused: {reason}"),
            Error::FrameTooLarge {
                message_id,
                size,
                limit,
            } => write!(
                f,
                "message {message_id:?} refused before sending: its header frame (properties and \
                 headers) is {size} bytes, over the connection's frame limit of {limit} bytes"
            ),
            Error::InvalidName { kind, name, reason } => {
                write!(f, "invalid {kind} name {name:?}: {reason}")
            }
            Error::InvalidArgument { reason } => write!(f, "invalid argument: {reason}"),
            Error::Codec {
                content_type,
                source,
            } => write!(
                f,
                "codec failed for content type {content_type:?}: {source}"
            ),
            Error::Sql { context, source } => {
                write!(f, "database error while {context}: ")?;
                write_sql_source(f, source.as_ref())
            }
            Error::SchemaNotFound { what } => write!(f, "schema not found: {what}"),
            Error::Io { context, source } => write!(f, "i/o error while {context}: {source}"),
            Error::Cancelled { queue } => write!(
                f,
                "the broker cancelled the consumer of queue {queue:?} (was the queue deleted?)"
            ),
            Error::Handler { source } => write!(f, "handler failed: {source}"),
            Error::Responder { message } => write!(f, "the responder failed: {message}"),
            Error::RequestTimeout {
                routing_key,
                correlation_id,
                after,
            } => write!(
                f,
                "no reply to request {correlation_id:?} sent to {routing_key:?} within {after:?}"
            ),
            Error::Replay { report, source } => write!(
                f,
                "the replay of {:?} stopped after it {report}: {source}",
                report.queue
            ),
            Error::StreamRetry {
                stream,
                offset,
                message_id,
                reason,
            } => {
                let at = offset
                    .map(|o| format!(" at offset {o}"))
                    .unwrap_or_default();
                write!(
                    f,
                    "a handler on stream {stream:?} asked to retry message {message_id:?}{at}, which a stream refuses: a retry would append a second copy to the log for every reader; it was parked on \"{stream}.parked\" instead. Choose one of: \
                     park it (Outcome::park, to {stream}.parked), reject it (Outcome::reject, \
                     to {stream}.dlq), or record its x-stream-offset, accept it and read from \
                     that offset again later. The handler's reason: {reason}"
                )
            }
            Error::Credentials { reason } => write!(f, "no broker credentials: {reason}"),
            Error::Blocked { reason, after } => write!(
                f,
                "the broker is blocking publishing ({reason}); not published within {after:?}"
            ),
            Error::Batch { report } => write!(f, "batch publish: {report}"),
            Error::InvalidBatch { index, source } => write_refused(f, *index, source),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Connect { source, .. }
            | Error::Codec { source, .. }
            | Error::Sql { source, .. }
            | Error::Handler { source } => Some(source.as_ref()),
            Error::Amqp { source, .. } => Some(source.as_ref()),
            Error::Io { source, .. } => Some(source),
            Error::Replay { source, .. } | Error::InvalidBatch { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// An error that retrying cannot fix: a handler returning it (as the `Err` of its result)
/// rejects the message to `{queue}.dlq` at once, without spending the retry policy.
#[derive(Debug)]
pub struct FatalError(pub BoxError);

impl FatalError {
    /// Wraps any error (or a message) as fatal.
    pub fn new(error: impl Into<BoxError>) -> FatalError {
        FatalError(error.into())
    }
}

impl fmt::Display for FatalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for FatalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_read_str_and_string_payloads() {
        let caught = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        let literal = caught(|| panic!("oops"));
        let formatted = caught(|| panic!("oops {}", 2));
        let other = caught(|| std::panic::panic_any(7_u8));
        assert_eq!(panic_message(&*literal), "oops");
        assert_eq!(panic_message(&*formatted), "oops 2");
        assert_eq!(panic_message(&*other), "a non-string payload");
    }

    #[test]
    fn sources_are_chained() {
        let e = Error::Io {
            context: "reading".into(),
            source: std::io::Error::other("disk"),
        };
        assert_eq!(e.source().map(|s| s.to_string()), Some("disk".to_string()));
        assert_eq!(e.to_string(), "i/o error while reading: disk");
    }

    #[test]
    fn lost_connection_is_retriable_and_unroutable_is_not() {
        let lost = Error::amqp("publishing", AmqpError::link_lost("i/o loop ended"));
        assert!(lost.is_retriable());
        assert!(lost.is_connection_lost());
        let un = Error::Unroutable {
            exchange: "x".into(),
            routing_key: "k".into(),
            message_id: "m".into(),
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        };
        assert!(un.is_unroutable());
        assert!(!un.is_retriable());
    }
}
