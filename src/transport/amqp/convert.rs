//! The seam's types to amiquip's and back, where a frame is sent or read: properties and
//! tables, a publish, confirms, returns, the blocked notice, declarations, errors, deliveries.
//! Going out, the crate's values are moved into amiquip's; coming in, amiquip's are read through
//! its getters (its properties give no way to move them out).

use amiquip::AmqpValue as A;

use super::super::channel::{ConsumerMessage, Delivery, Settle};
use super::super::wire::{
    AmqpError, AmqpProperties, AmqpValue, Blocked, Confirm, ConfirmPayload, ConsumerOptions,
    ExchangeDeclareOptions, ExchangeType, FieldTable, Publish, QueueDeclareOptions,
    QueueDeleteOptions, Return,
};
use crate::wire::Decimal;

pub(super) fn value_out(v: AmqpValue) -> A {
    match v {
        AmqpValue::Boolean(b) => A::Boolean(b),
        AmqpValue::ShortShortInt(i) => A::ShortShortInt(i),
        AmqpValue::ShortShortUInt(i) => A::ShortShortUInt(i),
        AmqpValue::ShortInt(i) => A::ShortInt(i),
        AmqpValue::ShortUInt(i) => A::ShortUInt(i),
        AmqpValue::LongInt(i) => A::LongInt(i),
        AmqpValue::LongUInt(i) => A::LongUInt(i),
        AmqpValue::LongLongInt(i) => A::LongLongInt(i),
        AmqpValue::Float(f) => A::Float(f),
        AmqpValue::Double(f) => A::Double(f),
        AmqpValue::DecimalValue(d) => A::DecimalValue(amq_protocol_types::DecimalValue {
            scale: d.scale,
            value: d.value,
        }),
        AmqpValue::LongString(s) => A::LongString(s),
        AmqpValue::FieldArray(a) => A::FieldArray(a.into_iter().map(value_out).collect()),
        AmqpValue::Timestamp(t) => A::Timestamp(t),
        AmqpValue::FieldTable(t) => A::FieldTable(table_out(t)),
        AmqpValue::ByteArray(b) => A::ByteArray(b),
        AmqpValue::Void => A::Void,
    }
}

pub(super) fn table_out(t: FieldTable) -> amiquip::FieldTable {
    t.into_iter().map(|(k, v)| (k, value_out(v))).collect()
}

fn value_in(v: &A) -> AmqpValue {
    match v {
        A::Boolean(b) => AmqpValue::Boolean(*b),
        A::ShortShortInt(i) => AmqpValue::ShortShortInt(*i),
        A::ShortShortUInt(i) => AmqpValue::ShortShortUInt(*i),
        A::ShortInt(i) => AmqpValue::ShortInt(*i),
        A::ShortUInt(i) => AmqpValue::ShortUInt(*i),
        A::LongInt(i) => AmqpValue::LongInt(*i),
        A::LongUInt(i) => AmqpValue::LongUInt(*i),
        A::LongLongInt(i) => AmqpValue::LongLongInt(*i),
        A::Float(f) => AmqpValue::Float(*f),
        A::Double(f) => AmqpValue::Double(*f),
        A::DecimalValue(d) => AmqpValue::DecimalValue(Decimal {
            scale: d.scale,
            value: d.value,
        }),
        A::LongString(s) => AmqpValue::LongString(s.clone()),
        A::FieldArray(a) => AmqpValue::FieldArray(a.iter().map(value_in).collect()),
        A::Timestamp(t) => AmqpValue::Timestamp(*t),
        A::FieldTable(t) => AmqpValue::FieldTable(table_in(t)),
        A::ByteArray(b) => AmqpValue::ByteArray(b.clone()),
        A::Void => AmqpValue::Void,
    }
}

pub(super) fn table_in(t: &amiquip::FieldTable) -> FieldTable {
    t.iter().map(|(k, v)| (k.clone(), value_in(v))).collect()
}

pub(crate) fn properties_out(p: AmqpProperties) -> amiquip::AmqpProperties {
    let AmqpProperties {
        content_type,
        content_encoding,
        headers,
        delivery_mode,
        priority,
        correlation_id,
        reply_to,
        expiration,
        message_id,
        timestamp,
        type_,
        user_id,
        app_id,
        cluster_id,
    } = p;
    let mut a = amiquip::AmqpProperties::default();
    macro_rules! set {
        ($($field:ident => $with:ident),*) => {
            $( if let Some(v) = $field { a = a.$with(v); } )*
        };
    }
    set!(content_type => with_content_type, content_encoding => with_content_encoding,
        delivery_mode => with_delivery_mode, priority => with_priority,
        correlation_id => with_correlation_id, reply_to => with_reply_to,
        expiration => with_expiration, message_id => with_message_id,
        timestamp => with_timestamp, type_ => with_type_, user_id => with_user_id,
        app_id => with_app_id, cluster_id => with_cluster_id);
    if let Some(h) = headers {
        a = a.with_headers(table_out(h));
    }
    a
}

pub(super) fn properties_in(a: &amiquip::AmqpProperties) -> AmqpProperties {
    AmqpProperties {
        content_type: a.content_type().clone(),
        content_encoding: a.content_encoding().clone(),
        headers: a.headers().as_ref().map(table_in),
        delivery_mode: *a.delivery_mode(),
        priority: *a.priority(),
        correlation_id: a.correlation_id().clone(),
        reply_to: a.reply_to().clone(),
        expiration: a.expiration().clone(),
        message_id: a.message_id().clone(),
        timestamp: *a.timestamp(),
        type_: a.type_().clone(),
        user_id: a.user_id().clone(),
        app_id: a.app_id().clone(),
        cluster_id: a.cluster_id().clone(),
    }
}

pub(super) fn publish_out(p: Publish<'_>) -> amiquip::Publish<'_> {
    amiquip::Publish {
        body: p.body,
        routing_key: p.routing_key,
        mandatory: p.mandatory,
        immediate: false,
        properties: properties_out(p.properties),
    }
}

pub(super) fn confirm_in(c: amiquip::Confirm) -> Confirm {
    let payload = |p: amiquip::ConfirmPayload| ConfirmPayload {
        delivery_tag: p.delivery_tag,
        multiple: p.multiple,
    };
    match c {
        amiquip::Confirm::Ack(p) => Confirm::Ack(payload(p)),
        amiquip::Confirm::Nack(p) => Confirm::Nack(payload(p)),
    }
}

pub(super) fn return_in(r: amiquip::Return) -> Return {
    Return {
        properties: properties_in(&r.properties),
        reply_code: r.reply_code,
        reply_text: r.reply_text,
        exchange: r.exchange,
        routing_key: r.routing_key,
    }
}

pub(super) fn blocked_in(b: amiquip::ConnectionBlockedNotification) -> Blocked {
    match b {
        amiquip::ConnectionBlockedNotification::Blocked(reason) => Blocked::Blocked(reason),
        amiquip::ConnectionBlockedNotification::Unblocked => Blocked::Unblocked,
    }
}

pub(super) fn exchange_type_out(t: ExchangeType) -> amiquip::ExchangeType {
    match t {
        ExchangeType::Direct => amiquip::ExchangeType::Direct,
        ExchangeType::Fanout => amiquip::ExchangeType::Fanout,
        ExchangeType::Topic => amiquip::ExchangeType::Topic,
        ExchangeType::Headers => amiquip::ExchangeType::Headers,
        ExchangeType::Custom(name) => amiquip::ExchangeType::Custom(name),
    }
}

pub(super) fn queue_declare_out(o: QueueDeclareOptions) -> amiquip::QueueDeclareOptions {
    amiquip::QueueDeclareOptions {
        durable: o.durable,
        exclusive: o.exclusive,
        auto_delete: o.auto_delete,
        arguments: table_out(o.arguments),
    }
}

pub(super) fn exchange_declare_out(o: ExchangeDeclareOptions) -> amiquip::ExchangeDeclareOptions {
    amiquip::ExchangeDeclareOptions {
        durable: o.durable,
        auto_delete: o.auto_delete,
        internal: o.internal,
        arguments: table_out(o.arguments),
    }
}

pub(super) fn queue_delete_out(o: QueueDeleteOptions) -> amiquip::QueueDeleteOptions {
    amiquip::QueueDeleteOptions {
        if_unused: o.if_unused,
        if_empty: o.if_empty,
    }
}

pub(super) fn consumer_out(o: ConsumerOptions) -> amiquip::ConsumerOptions {
    amiquip::ConsumerOptions {
        no_local: o.no_local,
        no_ack: o.no_ack,
        exclusive: o.exclusive,
        arguments: table_out(o.arguments),
    }
}

/// amiquip's error as the seam's: the broker's refusals keep their reply codes; everything
/// that means the link is gone is [`AmqpError::LinkLost`].
pub(crate) fn error_in(e: amiquip::Error) -> AmqpError {
    use amiquip::Error as E;
    match e {
        E::ServerClosedChannel { code, message, .. } => {
            AmqpError::ServerClosedChannel { code, message }
        }
        E::ServerClosedConnection { code, message } => {
            AmqpError::ServerClosedConnection { code, message }
        }
        E::ClientClosedChannel => AmqpError::ClientClosedChannel,
        E::ClientClosedConnection => AmqpError::ClientClosedConnection,
        e @ (E::EventLoopDropped
        | E::EventLoopClientDropped
        | E::UnexpectedSocketClose
        | E::MissedServerHeartbeats
        | E::IoErrorReadingSocket { .. }
        | E::IoErrorWritingSocket { .. }
        | E::IoThreadPanic) => AmqpError::link_lost(e.to_string()),
        e => AmqpError::Other {
            message: e.to_string(),
        },
    }
}

/// amiquip's delivery as the seam's: its body, exchange and routing key moved out, its
/// properties read; what is left of it (its channel and tag) settles it.
pub(super) fn delivery_in(mut d: amiquip::Delivery) -> Delivery {
    let properties = properties_in(&d.properties);
    d.properties = amiquip::AmqpProperties::default();
    Delivery::new(
        d.delivery_tag(),
        d.redelivered,
        std::mem::take(&mut d.exchange),
        std::mem::take(&mut d.routing_key),
        std::mem::take(&mut d.body),
        properties,
        Settle::with(d),
    )
}

pub(super) fn consumer_message_in(m: amiquip::ConsumerMessage) -> ConsumerMessage {
    use amiquip::ConsumerMessage as M;
    match m {
        M::Delivery(d) => ConsumerMessage::Delivery(delivery_in(d)),
        M::ClientCancelled => ConsumerMessage::ClientCancelled,
        M::ServerCancelled => ConsumerMessage::ServerCancelled,
        M::ClientClosedChannel => ConsumerMessage::ClientClosedChannel,
        M::ServerClosedChannel(e) => ConsumerMessage::ServerClosedChannel(error_in(e)),
        M::ClientClosedConnection => ConsumerMessage::ClientClosedConnection,
        M::ServerClosedConnection(e) => ConsumerMessage::ServerClosedConnection(error_in(e)),
    }
}
