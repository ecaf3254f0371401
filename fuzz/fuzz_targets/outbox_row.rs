//! An outbox row read back from the database, with any column of any SQL type (SQLite does
//! not enforce declared types; another program may have written the row): reading it is an
//! error or a message, never a panic; a message read from it either validates or is refused
//! before sending.
#![no_main]

use acemq_amqp::fuzzing::outbox_row;
use acemq_amqp::sql::Value;
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Col {
    Null,
    Integer(i64),
    Text(String),
    Bytes(Vec<u8>),
    /// Headers as a JSON object of arbitrary values, the common case worth reaching often.
    Headers(Vec<(String, Json)>),
}

#[derive(Arbitrary, Debug)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    List(Vec<i64>),
    Object(Vec<(String, String)>),
}

fn json(j: &Json) -> serde_json::Value {
    match j {
        Json::Null => serde_json::Value::Null,
        Json::Bool(b) => (*b).into(),
        Json::Int(i) => (*i).into(),
        Json::Float(f) => serde_json::Number::from_f64(*f)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Json::Text(s) => s.clone().into(),
        Json::List(l) => l.clone().into(),
        Json::Object(o) => o
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    }
}

fuzz_target!(|cols: Vec<Col>| {
    let row: Vec<Value> = cols
        .iter()
        .map(|c| match c {
            Col::Null => Value::Null,
            Col::Integer(i) => Value::Integer(*i),
            Col::Text(s) => Value::Text(s.clone()),
            Col::Bytes(b) => Value::Bytes(b.clone()),
            Col::Headers(h) => Value::Text(
                serde_json::Value::Object(h.iter().map(|(k, v)| (k.clone(), json(v))).collect())
                    .to_string(),
            ),
        })
        .collect();
    if let Ok(m) = outbox_row(&row) {
        assert!(!m.envelope.id.is_empty());
        let _ = m.validate();
    }
});
