//! [`AmqpProperties`]: a message's AMQP basic properties.

use super::FieldTable;

macro_rules! properties {
    ($( $(#[$doc:meta])* $field:ident, $with:ident: $ty:ty; )*) => {
        /// A message's AMQP basic properties, each unset until given. Read with the getter of
        /// each property's name; build with its `with_*`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct AmqpProperties {
            $( pub(crate) $field: Option<$ty>, )*
        }

        impl AmqpProperties {
            $(
                $(#[$doc])*
                pub fn $field(&self) -> &Option<$ty> {
                    &self.$field
                }
                #[doc = concat!("Sets `", stringify!($field), "`.")]
                #[must_use]
                pub fn $with(mut self, value: $ty) -> AmqpProperties {
                    self.$field = Some(value);
                    self
                }
            )*
        }
    };
}

properties! {
    /// `content-type`, e.g. `application/json`.
    content_type, with_content_type: String;
    /// `content-encoding`.
    content_encoding, with_content_encoding: String;
    /// The application headers.
    headers, with_headers: FieldTable;
    /// 1 transient, 2 persistent.
    delivery_mode, with_delivery_mode: u8;
    /// 0–9 on a priority queue.
    priority, with_priority: u8;
    /// `correlation-id`: request/reply matches a reply to its request by it.
    correlation_id, with_correlation_id: String;
    /// `reply-to`: the queue a reply goes to.
    reply_to, with_reply_to: String;
    /// `expiration`: a per-message TTL in milliseconds, as text.
    expiration, with_expiration: String;
    /// `message-id`.
    message_id, with_message_id: String;
    /// `timestamp`, seconds since the epoch.
    timestamp, with_timestamp: u64;
    /// `type`.
    type_, with_type: String;
    /// `user-id`: RabbitMQ checks it against the connection's user.
    user_id, with_user_id: String;
    /// `app-id`.
    app_id, with_app_id: String;
    /// `cluster-id` (deprecated by AMQP 0-9-1; carried as it came).
    cluster_id, with_cluster_id: String;
}

impl AmqpProperties {
    /// Takes the headers out, leaving none.
    pub fn take_headers(&mut self) -> Option<FieldTable> {
        self.headers.take()
    }
}
