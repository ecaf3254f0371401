//! The builder names of [`Message`] before every builder became `with_*` (issue 48), kept for a
//! release so that code written against them still builds, with a deprecation warning naming
//! the new one.

use super::{HeaderValue, Message};

impl Message {
    /// Renamed [`with_type`](Self::with_type): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_type`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn message_type(self, t: impl Into<String>) -> Self {
        self.with_type(t)
    }

    /// Renamed [`with_version`](Self::with_version): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_version`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn version(self, version: u32) -> Self {
        self.with_version(version)
    }

    /// Renamed [`with_origin`](Self::with_origin): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_origin`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn origin(self, origin: impl Into<String>) -> Self {
        self.with_origin(origin)
    }

    /// Renamed [`with_claim`](Self::with_claim): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_claim`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn claim(self, key: impl Into<String>) -> Self {
        self.with_claim(key)
    }

    /// Renamed [`with_correlation_id`](Self::with_correlation_id): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_correlation_id`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn correlation_id(self, id: impl Into<String>) -> Self {
        self.with_correlation_id(id)
    }

    /// Renamed [`with_causation_id`](Self::with_causation_id): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_causation_id`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn causation_id(self, id: impl Into<String>) -> Self {
        self.with_causation_id(id)
    }

    /// Renamed [`with_content_type`](Self::with_content_type): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_content_type`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn content_type(self, ct: impl Into<String>) -> Self {
        self.with_content_type(ct)
    }

    /// Renamed [`with_header`](Self::with_header): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_header`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn header(self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.with_header(name, value)
    }

    /// Renamed [`with_reply_to`](Self::with_reply_to): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_reply_to`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn reply_to(self, queue: impl Into<String>) -> Self {
        self.with_reply_to(queue)
    }

    /// Renamed [`with_expiration`](Self::with_expiration): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_expiration`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn expiration(self, ttl: std::time::Duration) -> Self {
        self.with_expiration(ttl)
    }

    /// Renamed [`with_priority`](Self::with_priority): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_priority`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn priority(self, priority: u8) -> Self {
        self.with_priority(priority)
    }

    /// Renamed [`with_persistent`](Self::with_persistent): every builder of `Message` is `with_*`.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `with_persistent`: every builder of `Message` is `with_*`"
    )]
    #[doc(hidden)]
    pub fn persistent(self, persistent: bool) -> Self {
        self.with_persistent(persistent)
    }
}
