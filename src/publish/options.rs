//! The publisher's options.

use std::sync::Arc;
use std::time::Duration;

use crate::codec::Codec;

/// Options for a [`Publisher`](crate::Publisher).
#[derive(Clone, Debug)]
pub struct PublisherOptions {
    pub(super) window: usize,
    pub(super) timeout: Duration,
    pub(super) mandatory: bool,
    pub(super) codec: Option<Arc<dyn Codec>>,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            window: 1024,
            timeout: Duration::from_secs(30),
            mandatory: true,
            codec: None,
        }
    }
}

impl PublisherOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most publishes awaiting a confirm at once; further callers wait for room. Defaults
    /// to 1024.
    #[must_use]
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }

    /// How long [`Publisher::publish`](crate::Publisher::publish) and [`Ticket::wait`](crate::Ticket::wait) wait for room, for recovery and for
    /// the confirm. Defaults to 30 s.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Publish with the mandatory flag, so an unroutable message is returned rather than
    /// dropped. Defaults to true.
    #[must_use]
    pub fn mandatory(mut self, mandatory: bool) -> Self {
        self.mandatory = mandatory;
        self
    }

    /// The codec for [`Publisher::publish_value`](crate::Publisher::publish_value). Defaults to the connection's.
    #[must_use]
    pub fn codec(mut self, codec: impl Codec + 'static) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }
}
