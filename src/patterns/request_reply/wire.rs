//! What both sides read and write of the family's reply wire: the prefix of a requester's own
//! reply queue, the text headers, and the failure reply (written by the responder, read by the
//! requester as [`Error::Responder`]).

use crate::transport::Return;

use crate::envelope::{headers, HeaderValue, Message};
use crate::error::{Error, Result};

/// The prefix of a requester's own reply queue: `acemq-reply-<id>`.
pub const REPLY_QUEUE_PREFIX: &str = "acemq-reply-";

/// A reply as the caller sees it: the responder's failure as [`Error::Responder`].
pub(super) fn answer(reply: Message) -> Result<Message> {
    match reply.headers.get(headers::REPLY_ERROR) {
        Some(v) => Err(Error::Responder {
            message: header_text(v).unwrap_or_else(|| "(unreadable error)".into()),
        }),
        None => Ok(reply),
    }
}

/// The family's failure reply: the body JSON `null` (`application/json`), so that a requester
/// whose reply consumer decodes every reply (Python's, Ruby's) reads it, and the error text in
/// `acemq-error`.
pub(super) fn failure(text: &str) -> Message {
    Message::new(&b"null"[..])
        .with_content_type("application/json")
        .with_header(headers::REPLY_ERROR, text)
}

/// A text header of a message the broker returned; empty when absent.
pub(super) fn returned_header(r: &Return, name: &str) -> String {
    r.properties
        .headers()
        .as_ref()
        .and_then(|h| h.get(name))
        .and_then(|v| header_text(&HeaderValue::from_amqp(v)))
        .unwrap_or_default()
}

pub(super) fn header_text(v: &HeaderValue) -> Option<String> {
    match v {
        HeaderValue::Text(s) => Some(s.clone()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_reply_reads_as_a_responder_error() {
        match answer(failure("Error: no such sku")) {
            Err(Error::Responder { message }) => assert_eq!(message, "Error: no such sku"),
            other => panic!("{other:?}"),
        }
        // The old form (an empty body, no content type) too.
        let old = Message::new(Vec::new()).with_header(headers::REPLY_ERROR, "no such sku");
        assert!(matches!(answer(old), Err(Error::Responder { .. })));
        assert!(answer(Message::new("ok")).is_ok());
    }
}
