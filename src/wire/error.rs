//! [`AmqpError`]: what a transport answers when a call fails.

use std::fmt;

/// A transport's failure: the broker's refusal, with AMQP's reply code as RabbitMQ sends it
/// (404 not found, 405 resource locked, 406 precondition failed, 403 access refused, 530 not
/// allowed, 540 not implemented), or the end of the link. Every transport answers in this form,
/// so [`Error`](crate::Error) reads one whichever answered.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AmqpError {
    /// The broker closed the channel.
    ServerClosedChannel {
        /// AMQP's reply code.
        code: u16,
        /// The broker's reply text.
        message: String,
    },
    /// The broker closed the connection.
    ServerClosedConnection {
        /// AMQP's reply code.
        code: u16,
        /// The broker's reply text.
        message: String,
    },
    /// This client closed the channel the call was made on.
    ClientClosedChannel,
    /// This client closed the connection.
    ClientClosedConnection,
    /// The link ended without the broker saying why: the socket closed or failed, heartbeats
    /// were missed, the I/O loop ended.
    LinkLost {
        /// What was seen, in the transport's words.
        reason: String,
    },
    /// Any other failure, in the transport's words.
    Other {
        /// What the transport said.
        message: String,
    },
}

impl AmqpError {
    /// The link ended, for this reason.
    pub(crate) fn link_lost(reason: impl Into<String>) -> AmqpError {
        AmqpError::LinkLost {
            reason: reason.into(),
        }
    }

    /// The reply code the broker closed the channel or connection with, if it did.
    pub fn reply_code(&self) -> Option<u16> {
        match self {
            AmqpError::ServerClosedChannel { code, .. }
            | AmqpError::ServerClosedConnection { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl fmt::Display for AmqpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AmqpError::ServerClosedChannel { code, message } => {
                write!(f, "server closed channel (code={code}, message={message})")
            }
            AmqpError::ServerClosedConnection { code, message } => {
                write!(
                    f,
                    "server closed connection (code={code}, message={message})"
                )
            }
            AmqpError::ClientClosedChannel => f.write_str("channel has been closed"),
            AmqpError::ClientClosedConnection => f.write_str("client closed connection"),
            AmqpError::LinkLost { reason } => write!(f, "connection lost: {reason}"),
            AmqpError::Other { message } => f.write_str(message),
        }
    }
}

impl std::error::Error for AmqpError {}
