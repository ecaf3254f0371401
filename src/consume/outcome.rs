//! The handler trait, the ordering it may ask for, and what the consumer makes of its result
//! ([`Verdict`]); what a handler returns ([`Outcome`], [`HandlerResult`]) is in the base layer
//! (`src/outcome.rs`).

use std::fmt;
use std::time::Duration;

use crate::envelope::Message;
use crate::error::panic_message;
use crate::error::FatalError;
pub use crate::outcome::{HandlerResult, Outcome};

/// Handles one message. Any `Fn(&Message) -> HandlerResult` is a handler.
///
/// A handler runs on a worker thread and may run on several at once: it needs `Sync` (and, for
/// a consumer that runs on its own threads, `Send + 'static`).
pub trait Handler {
    /// Handles one message.
    fn handle(&self, message: &Message) -> HandlerResult;

    /// `Some((max_messages, max_wait))` for a handler that handles messages in batches: each
    /// worker then gathers up to `max_messages` deliveries (no more than its share of the
    /// prefetch, `prefetch / concurrency`), waiting at most `max_wait` after the first for
    /// more, and hands them to [`handle_batch`](Self::handle_batch) in one call. Each
    /// message's result then goes its own way (acknowledgement, retry, dead letter) as if it
    /// had been handled alone. Defaults to `None`: one message at a time, through
    /// [`handle`](Self::handle). A wrapper around a batched handler passes this and
    /// [`handle_batch`](Self::handle_batch) on (this crate's wrappers and the chain's layers
    /// do), or the batching is lost — only the batching: each message is then handled alone
    /// through [`handle`](Self::handle), with the same outcomes. (Unlike the ordering this
    /// stays on the handler: a batch needs the handler's own `handle_batch` anyway.)
    fn batch_limits(&self) -> Option<(usize, std::time::Duration)> {
        None
    }

    /// Handles a batch (see [`batch_limits`](Self::batch_limits)): one result per message, in
    /// the order given — `Err(panic)` for a message whose handling panicked (a retry). A
    /// panic out of this call, or a wrong number of results, makes every message of the batch
    /// a retry. Defaults to [`handle`](Self::handle) on each message in turn.
    fn handle_batch(&self, messages: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
        messages
            .iter()
            .map(|m| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(m))))
            .collect()
    }

    /// The per-key ordering this handler asks the consumer running it for: `None` (the
    /// default) for none. Set by [`ordered`](crate::patterns::ordering::ordered); a wrapper around another
    /// handler (the chain's, [`idempotent`](fn@crate::patterns::idempotent::idempotent)) passes on its inner
    /// handler's, so that the ordering holds wherever it sits in a chain. A handler written by
    /// hand around an ordered one should do the same, or the ordering is lost — which is why
    /// [`ConsumerOptions::ordering`](crate::ConsumerOptions::ordering), which nothing can hide,
    /// is the better place for it; the consumer asks the handler only when its options set
    /// none.
    fn ordering(&self) -> Option<&OrderBy> {
        None
    }
}

/// The key function of an [`OrderBy`].
type OrderKeyFn = Box<dyn Fn(&Message) -> Option<String> + Send + Sync>;

/// What an ordered handler asks of the consumer that runs it (see
/// [`patterns::ordering`](crate::patterns::ordering)): a key per message, and whether a retry
/// holds its key. Made by [`ordered`](crate::patterns::ordering::ordered).
pub struct OrderBy {
    key: OrderKeyFn,
    hold_on_retry: bool,
}

impl OrderBy {
    /// Orders by `key`; an empty or missing key is not ordered.
    pub fn new<K>(key: K) -> OrderBy
    where
        K: Fn(&Message) -> Option<String> + Send + Sync + 'static,
    {
        OrderBy {
            key: Box::new(key),
            hold_on_retry: false,
        }
    }

    /// A retry or in-progress wait of a keyed message is spent in the consumer on the same
    /// delivery, keeping its key, so that later messages with the key stay behind it.
    pub fn hold_on_retry(mut self, hold: bool) -> OrderBy {
        self.hold_on_retry = hold;
        self
    }

    /// Whether retries hold their key.
    pub fn holds_retries(&self) -> bool {
        self.hold_on_retry
    }

    /// The ordering key of `message`: `None` for a missing or empty key (not ordered). A key
    /// function that panics is logged and the message is not ordered.
    pub fn key_of(&self, message: &Message) -> Option<String> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.key)(message))) {
            Ok(key) => key.filter(|k| !k.is_empty()),
            Err(panic) => {
                log::error!(
                    "acemq: the ordering key function panicked on message {} ({}); it is \
                     handled without ordering",
                    message.id(),
                    panic_message(&*panic)
                );
                None
            }
        }
    }
}

impl fmt::Debug for OrderBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrderBy")
            .field("hold_on_retry", &self.hold_on_retry)
            .finish_non_exhaustive()
    }
}

impl<H: Handler + ?Sized> Handler for std::sync::Arc<H> {
    fn handle(&self, message: &Message) -> HandlerResult {
        self.as_ref().handle(message)
    }
    fn ordering(&self) -> Option<&OrderBy> {
        self.as_ref().ordering()
    }
    fn batch_limits(&self) -> Option<(usize, std::time::Duration)> {
        self.as_ref().batch_limits()
    }
    fn handle_batch(&self, messages: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
        self.as_ref().handle_batch(messages)
    }
}

impl Handler for Box<dyn Handler + Send + Sync> {
    fn handle(&self, message: &Message) -> HandlerResult {
        self.as_ref().handle(message)
    }
    fn ordering(&self) -> Option<&OrderBy> {
        self.as_ref().ordering()
    }
    fn batch_limits(&self) -> Option<(usize, std::time::Duration)> {
        self.as_ref().batch_limits()
    }
    fn handle_batch(&self, messages: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
        self.as_ref().handle_batch(messages)
    }
}

impl<F> Handler for F
where
    F: Fn(&Message) -> HandlerResult,
{
    fn handle(&self, message: &Message) -> HandlerResult {
        self(message)
    }
}

/// What the consumer does with a message, with the family's error texts already written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accept,
    /// Retry: `why` describes the failure (`Error: …`, `panic: …`, or the handler's reason).
    Retry {
        delay: Option<Duration>,
        why: String,
    },
    /// To `{queue}.dlq` with this `x-acemq-error`.
    DeadLetter {
        error: String,
    },
    /// To `{queue}.parked` with this `x-acemq-error`.
    Park {
        error: String,
    },
    /// Back to the queue after `delay`, attempt unchanged.
    InProgress {
        delay: Duration,
    },
}

impl Verdict {
    /// What the handler's answer is, before the consumer weighs it against its policy
    /// (`ladder/plan.rs`): a dead letter here is the handler's own reject.
    pub(crate) fn decision(&self) -> crate::observe::Decision {
        use crate::observe::Decision;
        match self {
            Verdict::Accept => Decision::Accept,
            Verdict::Retry { .. } => Decision::Retry,
            Verdict::DeadLetter { .. } => Decision::Reject,
            Verdict::Park { .. } => Decision::Park,
            Verdict::InProgress { .. } => Decision::InProgress,
        }
    }

    /// [`decision`](Self::decision)'s label.
    pub(crate) fn label(&self) -> &'static str {
        self.decision().as_str()
    }

    /// The error to report to the observer.
    pub(crate) fn error(&self) -> Option<&str> {
        match self {
            Verdict::Retry { why, .. } => Some(why),
            Verdict::DeadLetter { error } | Verdict::Park { error } => Some(error),
            _ => None,
        }
    }
}

/// Why a message whose retry copy cannot be sent (its header frame over the frame limit) is
/// dead-lettered instead: `why` is the retry's reason.
pub(crate) fn retry_failed(why: &str) -> String {
    format!("its retry could not be sent: {why}")
}

/// Why a message whose in-progress copy cannot be sent is dead-lettered instead.
pub(crate) const IN_PROGRESS_FAILED: &str =
    "its in-progress copy (back to the queue, attempt unchanged) could not be sent";

/// The most of a reason a trimmed copy's `x-acemq-error` repeats, and the most of the dropped
/// headers' names it lists: the copy must stay well inside the frame it was trimmed for.
const TRIMMED_REASON_MAX: usize = 4096;
const TRIMMED_NAMES_MAX: usize = 1024;

/// The `x-acemq-error` of a copy sent trimmed because its whole header frame (`size` bytes)
/// was over the connection's frame `limit`: `reason` (shortened if long), why it was trimmed,
/// and the application headers `dropped` (named, as many as fit a short list).
pub(crate) fn trimmed_reason(
    reason: &str,
    size: usize,
    limit: usize,
    dropped: &[String],
) -> String {
    let mut names = String::new();
    let mut listed = 0;
    for name in dropped {
        if names.len() + name.len() > TRIMMED_NAMES_MAX {
            break;
        }
        if !names.is_empty() {
            names.push_str(", ");
        }
        names.push_str(name);
        listed += 1;
    }
    if listed < dropped.len() {
        names.push_str(&format!(" and {} more", dropped.len() - listed));
    }
    if dropped.is_empty() {
        names.push_str("none");
    }
    format!(
        "{}; its copy's header frame of {size} bytes was over the connection's frame limit of \
         {limit} bytes, so it was sent trimmed, its application headers dropped: {names}",
        shorten(reason, TRIMMED_REASON_MAX)
    )
}

/// `s` cut to at most `max` bytes (on a character boundary), with `…` when cut.
fn shorten(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len()).into()
}

/// Turns what a handler produced into a verdict, with the family's texts: a handler's reject is
/// "the handler rejected it: …", its park "the handler parked it: …", a [`FatalError`] "the
/// handler reported an unprocessable message: FatalError: …", a body that could not be decoded
/// ([`Error::Codec`](crate::Error::Codec) returned by the handler) "could not be decoded: …"
/// (parked) unless its source is a [`FatalError`] (dead-lettered, as above) or a crate `Error`
/// (a failing claim-check store: retried); any other error (`Error: …`) or a panic (`panic: …`) is a retry.
pub(crate) fn decide(result: std::thread::Result<HandlerResult>) -> Verdict {
    match result {
        Ok(Ok(outcome)) => match outcome {
            Outcome::Accept => Verdict::Accept,
            Outcome::Retry { delay, reason } => Verdict::Retry { delay, why: reason },
            Outcome::Reject { reason } => Verdict::DeadLetter {
                error: format!("the handler rejected it: {reason}"),
            },
            Outcome::Park { reason } => Verdict::Park {
                error: format!("the handler parked it: {reason}"),
            },
            Outcome::InProgress { delay } => Verdict::InProgress { delay },
        },
        Ok(Err(e)) => {
            if let Some(fatal) = e.downcast_ref::<FatalError>() {
                return Verdict::DeadLetter {
                    error: format!(
                        "the handler reported an unprocessable message: FatalError: {fatal}"
                    ),
                };
            }
            if let Some(crate::Error::Codec { source, .. }) = e.downcast_ref::<crate::Error>() {
                // A codec that could not read the body for good (a claim check whose payload
                // is gone) says so with a `FatalError`: dead-lettered; one whose store failed
                // (a crate `Error`) may succeed later: retried.
                if let Some(fatal) = source.downcast_ref::<FatalError>() {
                    return Verdict::DeadLetter {
                        error: format!(
                            "the handler reported an unprocessable message: FatalError: {fatal}"
                        ),
                    };
                }
                if source.downcast_ref::<crate::Error>().is_some() {
                    return Verdict::Retry {
                        delay: None,
                        why: format!("Error: {e}"),
                    };
                }
                return Verdict::Park {
                    error: format!("could not be decoded: {e}"),
                };
            }
            Verdict::Retry {
                delay: None,
                why: format!("Error: {e}"),
            }
        }
        Err(panic) => Verdict::Retry {
            delay: None,
            why: format!("panic: {}", panic_message(&*panic)),
        },
    }
}

/// A duration the way Go prints one (`30s`, `2m0s`, `6h0m0s`, `1.5s`): the family's three
/// libraries each print their own way, and this one reads best in a log line.
pub(crate) fn format_duration(d: Duration) -> String {
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    let millis = d.subsec_millis();
    let secs = if millis == 0 {
        format!("{s}s")
    } else {
        let frac = format!("{millis:03}");
        format!("{s}.{}s", frac.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_retry_fatal_rejects_panics_retry() {
        let v = decide(Ok(Err("boom".into())));
        assert_eq!(
            v,
            Verdict::Retry {
                delay: None,
                why: "Error: boom".into()
            }
        );
        let v = decide(Ok(Err(Box::new(FatalError::new("bad input")))));
        assert_eq!(
            v.error(),
            Some("the handler reported an unprocessable message: FatalError: bad input")
        );
        let v = decide(Ok(Ok(Outcome::reject("no such customer"))));
        assert_eq!(v.error(), Some("the handler rejected it: no such customer"));
        let v = decide(Ok(Ok(Outcome::park("odd"))));
        assert_eq!(v.error(), Some("the handler parked it: odd"));
        let codec = |source: crate::BoxError| -> HandlerResult {
            Err(Box::new(crate::Error::Codec {
                content_type: "application/octet-stream".into(),
                source,
            }))
        };
        assert_eq!(decide(Ok(codec("not json".into()))).label(), "park");
        assert_eq!(
            decide(Ok(codec(Box::new(FatalError::new("claim gone"))))).label(),
            "reject"
        );
        let store_down = crate::Error::Io {
            context: "reading a claim check".into(),
            source: std::io::Error::other("disk"),
        };
        assert_eq!(decide(Ok(codec(Box::new(store_down)))).label(), "retry");
        let panic = std::panic::catch_unwind(|| -> HandlerResult { panic!("oops") });
        let v = decide(panic);
        assert_eq!(v.label(), "retry");
        assert_eq!(v.error(), Some("panic: oops"));
    }

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m0s");
        assert_eq!(format_duration(Duration::from_secs(6 * 3600)), "6h0m0s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    }
}
