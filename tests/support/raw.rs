//! A foreign AMQP client: raw amiquip, writing and reading exactly what the test says, for
//! interop with what the other AceMQ libraries put on the wire.

use amiquip::{
    AmqpProperties, AmqpValue, Channel, ExchangeDeclareOptions, ExchangeType, FieldTable, Publish,
    QueueDeclareOptions,
};

pub struct Raw {
    connection: amiquip::Connection,
    pub channel: Channel,
}

impl Raw {
    pub fn open() -> Raw {
        let mut connection = amiquip::Connection::insecure_open(&super::amqp_url())
            .unwrap_or_else(|e| panic!("RabbitMQ is not reachable ({e}): run `scripts/test`"));
        let channel = connection.open_channel(None).expect("raw channel");
        Raw {
            connection,
            channel,
        }
    }

    /// Publishes with exactly these properties (no confirm: a basic_get follows on the same
    /// channel, which orders it).
    pub fn publish(&self, exchange: &str, routing_key: &str, body: &[u8], props: AmqpProperties) {
        self.channel
            .basic_publish(
                exchange,
                Publish {
                    body,
                    routing_key: routing_key.to_string(),
                    mandatory: false,
                    immediate: false,
                    properties: props,
                },
            )
            .expect("raw publish");
    }

    /// One message from `queue`, acknowledged: its properties and routing key.
    pub fn get(&self, queue: &str) -> Option<(AmqpProperties, String, Vec<u8>)> {
        let got = self.channel.basic_get(queue, false).expect("raw get")?;
        let d = got.delivery;
        let out = (d.properties.clone(), d.routing_key.clone(), d.body.clone());
        d.ack(&self.channel).expect("raw ack");
        Some(out)
    }

    pub fn declare_exchange(&self, name: &str) {
        self.channel
            .exchange_declare(
                ExchangeType::Direct,
                name,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
            )
            .expect("raw exchange declare");
    }

    /// Declares a durable queue with exactly these arguments; the broker's refusal is returned.
    pub fn declare_queue(&self, name: &str, args: FieldTable) -> Result<(), amiquip::Error> {
        self.channel
            .queue_declare(
                name,
                QueueDeclareOptions {
                    durable: true,
                    arguments: args,
                    ..QueueDeclareOptions::default()
                },
            )
            .map(|_| ())
    }

    /// A transient reply queue as the family's requesters (the Python library's, say) declare
    /// theirs: `acemq-reply-<hex>`, classic, exclusive, auto-delete (it goes with this
    /// connection). Its name.
    pub fn family_reply_queue(&self) -> String {
        let name = format!("acemq-reply-{}", acemq_amqp::new_id().replace('-', ""));
        self.channel
            .queue_declare(
                name.as_str(),
                QueueDeclareOptions {
                    durable: false,
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
            )
            .expect("declare the reply queue");
        name
    }

    pub fn bind(&self, queue: &str, exchange: &str, key: &str) {
        self.channel
            .queue_bind(queue, exchange, key, FieldTable::new())
            .expect("raw bind");
    }

    pub fn close(self) {
        let _ = self.connection.close();
    }
}

pub fn text(s: &str) -> AmqpValue {
    AmqpValue::LongString(s.to_string())
}

/// A wire value read as text: a long string, or bytes that are UTF-8.
pub fn text_of(v: Option<&AmqpValue>) -> Option<String> {
    match v? {
        AmqpValue::LongString(s) => Some(s.clone()),
        AmqpValue::ByteArray(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

/// The header `name` of these properties, read as text ([`text_of`]).
pub fn header_text(props: &AmqpProperties, name: &str) -> Option<String> {
    text_of(props.headers().as_ref()?.get(name))
}

/// A typed value as the fixtures spell it (`longstr`, `bytes`, `i8`, `u16`, `i32`, `i64`).
pub fn typed(kind: &str, value: &serde_json::Value) -> AmqpValue {
    let int = || value.as_i64().expect("an integer value");
    match kind {
        "longstr" => AmqpValue::LongString(value.as_str().expect("text").to_string()),
        "bytes" => AmqpValue::ByteArray(value.as_str().expect("text").as_bytes().to_vec()),
        "i8" => AmqpValue::ShortShortInt(int() as i8),
        "u16" => AmqpValue::ShortUInt(int() as u16),
        "i32" => AmqpValue::LongInt(int() as i32),
        "i64" => AmqpValue::LongLongInt(int()),
        other => panic!("fixture type {other:?} is not known here"),
    }
}

/// The fixture type name of a wire value.
pub fn kind_of(v: &AmqpValue) -> &'static str {
    match v {
        AmqpValue::LongString(_) => "longstr",
        AmqpValue::ByteArray(_) => "bytes",
        AmqpValue::ShortShortInt(_) => "i8",
        AmqpValue::ShortUInt(_) => "u16",
        AmqpValue::LongInt(_) => "i32",
        AmqpValue::LongLongInt(_) => "i64",
        _ => "other",
    }
}
