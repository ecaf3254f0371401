#![allow(dead_code)] // each target uses part of it
//! Shared by the targets: an AMQP delivery made of fuzzed bytes, parsed as amiquip parses a
//! content header's table off the wire.

use amiquip::{AmqpProperties, FieldTable};

/// `[rk_len][rk][message_id_len][message_id][table (AMQP field-table encoding)][body]`:
/// routing key and message id as AMQP short strings, the header table exactly as it would
/// arrive in a frame. `None` when the bytes do not parse (the I/O layer would refuse them).
pub struct Wire {
    pub routing_key: String,
    pub message_id: Option<String>,
    pub table: FieldTable,
    pub body: Vec<u8>,
}

pub fn parse(data: &[u8]) -> Option<Wire> {
    use amq_protocol_types::parsing::{parse_field_table, parse_short_string};
    let (rest, routing_key) = parse_short_string(data).ok()?;
    let (rest, message_id) = parse_short_string(rest).ok()?;
    let (rest, table) = parse_field_table(rest).ok()?;
    Some(Wire {
        routing_key,
        message_id: Some(message_id).filter(|m| !m.is_empty()),
        table,
        body: rest.to_vec(),
    })
}

pub fn properties(w: &Wire) -> AmqpProperties {
    let mut p = AmqpProperties::default().with_headers(w.table.clone());
    if let Some(id) = &w.message_id {
        p = p.with_message_id(id.clone());
    }
    p
}

/// The table as amiquip would write it, parsed back.
pub fn through_the_wire(table: &FieldTable) -> FieldTable {
    use amq_protocol_types::generation::gen_field_table;
    use amq_protocol_types::parsing::parse_field_table;
    let mut size = 64 * 1024;
    loop {
        let mut buf = vec![0u8; size];
        match gen_field_table((&mut buf, 0), table) {
            Ok((_, n)) => {
                let (_, parsed) = parse_field_table(&buf[..n]).expect("what was written parses");
                return parsed;
            }
            Err(_) if size < 64 * 1024 * 1024 => size *= 4,
            Err(e) => panic!("cannot write the table: {e:?}"),
        }
    }
}
