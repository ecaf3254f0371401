//! The family's codecs against the family's bytes (`tests/fixtures/codec_interop.json`, derived
//! from the Java and Go samples the family pins): each format's sample read here gives the
//! expected payload, what this crate writes is the fixture's bytes and reads back, a
//! `CompositeCodec` picks the codec by content type as the family does, and on the broker a
//! consumer reads a foreign YAML message by its content type.

mod support;

#[allow(unused_imports)]
use std::sync::{Arc, Mutex};

use acemq_amqp::codecs::{CompositeCodec, TextCodec};
use acemq_amqp::{BytesCodec, Codec, FatalError, JsonCodec, Message};
use serde_json::{json, Value};

#[allow(dead_code)]
struct Sample {
    format: String,
    producer: String,
    content_type: String,
    body: Vec<u8>,
    expected: Value,
}

fn b64(s: &str) -> Vec<u8> {
    // A tiny standard-alphabet decoder, so the test needs no Base64 crate.
    let table = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= table(c) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

fn fixtures() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/codec_interop.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

fn samples(key: &str, payload: &str) -> Vec<Sample> {
    fixtures()[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Sample {
            format: s["format"].as_str().unwrap().into(),
            producer: s["producer"].as_str().unwrap_or("acemq-rust").into(),
            content_type: s["content_type"].as_str().unwrap().into(),
            body: b64(s["body_base64"].as_str().unwrap()),
            expected: s[payload].clone(),
        })
        .collect()
}

/// The codec for a fixture format, when its feature is on.
#[allow(unused_variables)]
fn codec_for(format: &str) -> Option<Box<dyn Codec>> {
    let f = fixtures();
    match format {
        #[cfg(feature = "yaml")]
        "yaml" => Some(Box::new(acemq_amqp::codecs::yaml::YamlCodec)),
        #[cfg(feature = "toml")]
        "toml" => Some(Box::new(acemq_amqp::codecs::toml::TomlCodec)),
        #[cfg(feature = "xml")]
        "xml" => Some(Box::new(
            acemq_amqp::codecs::xml::XmlCodec::new("OrderPlaced").unwrap(),
        )),
        #[cfg(feature = "avro")]
        "avro" => Some(Box::new(
            acemq_amqp::codecs::avro::AvroCodec::new(f["avro_schema"].as_str().unwrap()).unwrap(),
        )),
        #[cfg(feature = "avro")]
        "avro-registered" => Some(Box::new(
            acemq_amqp::codecs::avro::AvroCodec::registered(
                f["avro_schema"].as_str().unwrap(),
                f["avro_schema_id"].as_u64().unwrap() as u32,
            )
            .unwrap(),
        )),
        #[cfg(feature = "protobuf")]
        "protobuf" => Some(Box::new(acemq_amqp::codecs::protobuf::ProtobufCodec::new(
            order_placed(),
        ))),
        _ => None,
    }
}

/// `message OrderPlaced { string order_id = 1; int64 total_cents = 2; string tenant = 3; }` in
/// package `acemq.test`, as a descriptor (what `protoc --descriptor_set_out` would give).
#[cfg(feature = "protobuf")]
fn order_placed() -> acemq_amqp::codecs::protobuf::prost_reflect::MessageDescriptor {
    use acemq_amqp::codecs::protobuf::prost_reflect::prost_types::{
        field_descriptor_proto::{Label, Type},
        DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
    };
    use acemq_amqp::codecs::protobuf::prost_reflect::DescriptorPool;
    let field = |name: &str, number: i32, ty: Type, json: &str| FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        label: Some(Label::Optional as i32),
        r#type: Some(ty as i32),
        json_name: Some(json.into()),
        ..Default::default()
    };
    let file = FileDescriptorProto {
        name: Some("order.proto".into()),
        package: Some("acemq.test".into()),
        syntax: Some("proto3".into()),
        message_type: vec![DescriptorProto {
            name: Some("OrderPlaced".into()),
            field: vec![
                field("order_id", 1, Type::String, "orderId"),
                field("total_cents", 2, Type::Int64, "totalCents"),
                field("tenant", 3, Type::String, "tenant"),
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    DescriptorPool::from_file_descriptor_set(FileDescriptorSet { file: vec![file] })
        .unwrap()
        .get_message_by_name("acemq.test.OrderPlaced")
        .unwrap()
}

#[test]
fn every_family_sample_reads_as_expected() {
    let mut read = 0;
    for s in samples("samples", "expected") {
        let Some(codec) = codec_for(&s.format) else {
            continue;
        };
        let m = Message::new(s.body.clone()).with_content_type(s.content_type.clone());
        let got: Value = m
            .decode(codec.as_ref())
            .unwrap_or_else(|e| panic!("{} from {}: {e}", s.format, s.producer));
        assert_eq!(got, s.expected, "{} from {}", s.format, s.producer);
        assert!(
            codec.accepts(Some(&s.content_type)),
            "{} claims {}",
            s.format,
            s.content_type
        );
        read += 1;
    }
    let all = cfg!(all(
        feature = "yaml",
        feature = "toml",
        feature = "xml",
        feature = "avro",
        feature = "protobuf"
    ));
    assert!(!all || read == 11, "read {read} samples");
}

#[test]
fn what_this_writes_is_the_fixtures_bytes_and_reads_back() {
    for s in samples("written_here", "payload") {
        let Some(codec) = codec_for(&s.format) else {
            continue;
        };
        let m = Message::encode(codec.as_ref(), &s.expected)
            .unwrap_or_else(|e| panic!("{}: {e}", s.format));
        assert_eq!(
            m.content_type.as_deref(),
            Some(s.content_type.as_str()),
            "{}",
            s.format
        );
        assert_eq!(
            String::from_utf8_lossy(&m.body),
            String::from_utf8_lossy(&s.body),
            "{}",
            s.format
        );
        assert_eq!(m.body, s.body, "{}", s.format);
        let back: Value = m.decode(codec.as_ref()).unwrap();
        let expected = if s.format == "xml" {
            // XML has no types: the number comes back as text.
            let mut e = s.expected.clone();
            e["totalCents"] = json!("4250");
            e
        } else {
            s.expected.clone()
        };
        assert_eq!(back, expected, "{}", s.format);
    }
}

fn fatal(e: acemq_amqp::Error) -> String {
    match &e {
        acemq_amqp::Error::Codec { source, .. } => {
            assert!(source.downcast_ref::<FatalError>().is_some(), "{e}");
        }
        other => panic!("{other}"),
    }
    e.to_string()
}

#[test]
fn a_composite_codec_picks_the_codec_the_content_type_names() {
    let codec = CompositeCodec::new(JsonCodec).or(TextCodec).or(BytesCodec);
    assert_eq!(codec.content_type(), "application/json");
    let read = |body: &str, ct: Option<&str>| -> Value {
        let mut m = Message::new(body);
        m.content_type = ct.map(String::from);
        m.decode(&codec).unwrap()
    };
    assert_eq!(
        read(r#"{"a":1}"#, Some("application/json")),
        json!({"a": 1})
    );
    assert_eq!(
        read(r#"{"a":1}"#, Some("application/vnd.x+json; v=2")),
        json!({"a": 1})
    );
    assert_eq!(read("hi there", Some("text/plain")), json!("hi there"));
    // No content type: every codec is a candidate, in order (the family's rule).
    assert_eq!(read(r#"[1,2]"#, None), json!([1, 2]));
    assert_eq!(read("not json", None), json!("not json"));
    // A content type only bytes takes.
    assert_eq!(read("\u{1}", Some("image/png")), json!([1]));
    // Nothing takes it, without BytesCodec.
    let strict = CompositeCodec::new(JsonCodec).or(TextCodec);
    let e = Message::new("x")
        .with_content_type("image/png")
        .decode::<Value>(&strict)
        .unwrap_err();
    let text = fatal(e);
    assert!(text.contains("no codec here reads \"image/png\""), "{text}");
    let e = Message::new("not json")
        .with_content_type("application/json")
        .decode::<Value>(&strict)
        .unwrap_err();
    assert!(fatal(e).contains("no codec could read this message"));
    // Text: only text/*, never untyped.
    assert!(!TextCodec.accepts(None) && TextCodec.accepts(Some("TEXT/csv")));
    assert!(JsonCodec.accepts(None) && JsonCodec.accepts(Some("text/json")));
    assert!(!JsonCodec.accepts(Some("text/plain")));
    assert!(Message::encode(&TextCodec, &json!({"a": 1})).is_err());
}

#[cfg(all(feature = "yaml", feature = "toml", feature = "xml"))]
#[test]
fn optional_formats_are_chosen_by_content_type_and_never_claim_an_untyped_message() {
    use acemq_amqp::codecs::{toml::TomlCodec, xml::XmlCodec, yaml::YamlCodec};
    let codec = CompositeCodec::new(JsonCodec)
        .or(YamlCodec)
        .or(TomlCodec)
        .or(XmlCodec::default());
    for s in samples("samples", "expected") {
        if !["yaml", "toml", "xml"].contains(&s.format.as_str()) {
            continue;
        }
        let m = Message::new(s.body.clone()).with_content_type(s.content_type.clone());
        assert_eq!(
            m.decode::<Value>(&codec).unwrap(),
            s.expected,
            "{}",
            s.format
        );
    }
    for (codec, types) in [
        (
            Box::new(YamlCodec) as Box<dyn Codec>,
            &[
                "application/x-yaml",
                "text/yaml",
                "text/x-yaml",
                "application/vnd.k+yaml",
            ][..],
        ),
        (
            Box::new(TomlCodec),
            &["text/toml", "application/x.c+toml"][..],
        ),
        (
            Box::new(XmlCodec::default()),
            &["text/xml", "application/atom+xml"][..],
        ),
    ] {
        assert!(!codec.accepts(None), "{codec:?}");
        assert!(!codec.accepts(Some("application/json")), "{codec:?}");
        for t in types {
            assert!(codec.accepts(Some(t)), "{codec:?} {t}");
        }
    }
    // A TOML document is a table; XML has one root.
    assert!(Message::encode(&TomlCodec, &json!([1])).is_err());
    assert!(Message::encode(&XmlCodec::default(), &json!("x")).is_err());
}

#[cfg(feature = "xml")]
#[test]
fn xml_refuses_every_dtd_and_unknown_entities() {
    use acemq_amqp::codecs::xml::XmlCodec;
    let codec = XmlCodec::default();
    let laughs = r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><lolz>&lol2;</lolz>"#;
    let e = Message::new(laughs)
        .with_content_type("application/xml")
        .decode::<Value>(&codec)
        .unwrap_err();
    assert!(fatal(e).contains("document type declaration"));
    let e = Message::new("<a>&xxe;</a>")
        .with_content_type("application/xml")
        .decode::<Value>(&codec)
        .unwrap_err();
    assert!(fatal(e).contains("&xxe;"));
    let m = Message::new(r#"<a xmlns:p="urn:x" id="7"><p:b>1 &lt; 2 &#x26; &amp;</p:b><c/></a>"#)
        .with_content_type("text/xml");
    assert_eq!(
        m.decode::<Value>(&codec).unwrap(),
        json!({"id": "7", "b": "1 < 2 & &", "c": ""})
    );
    let e = Message::new("<a><b></a>")
        .with_content_type("application/xml")
        .decode::<Value>(&codec)
        .unwrap_err();
    fatal(e);
    let written = Message::encode(&codec, &json!({"ok": true, "n": null, "s": "<&>"})).unwrap();
    assert_eq!(
        String::from_utf8(written.body).unwrap(),
        "<message><ok>true</ok><n></n><s>&lt;&amp;&gt;</s></message>"
    );
}

#[cfg(feature = "avro")]
#[test]
fn avro_reads_by_the_content_types_framing_and_refuses_rather_than_guesses() {
    use acemq_amqp::codecs::avro::AvroCodec;
    let f = fixtures();
    let schema = f["avro_schema"].as_str().unwrap();
    let fixed = AvroCodec::new(schema).unwrap();
    let framed = b64("AAAAAAcGby0xtEIIYWNtZQ==");
    // A fixed codec refuses framed Avro, said or looking so.
    for ct in [Some("application/vnd.acemq.avro"), None] {
        let mut m = Message::new(framed.clone());
        m.content_type = ct.map(String::from);
        fatal(m.decode::<Value>(&fixed).unwrap_err());
    }
    // A registered one reads framed bodies by identifier, and refuses an unknown one.
    let reading = AvroCodec::reading(schema).unwrap();
    let m = Message::new(framed.clone()).with_content_type("application/vnd.acemq.avro");
    let e = fatal(m.decode::<Value>(&reading).unwrap_err());
    assert!(e.contains("schema id 7"), "{e}");
    reading.learn(7, schema).unwrap();
    assert_eq!(
        m.decode::<Value>(&reading).unwrap(),
        json!({"orderId": "o-1", "totalCents": 4250, "tenant": "acme"})
    );
    assert!(Message::encode(&reading, &json!({})).is_err(), "reads only");
    // Resolution onto a reader schema: a field the writer did not write takes its default.
    let newer = r#"{"type":"record","name":"OrderPlaced","namespace":"org.acemq.test","fields":[{"name":"orderId","type":"string"},{"name":"totalCents","type":"long"},{"name":"tenant","type":"string"},{"name":"channel","type":"string","default":"web"}]}"#;
    let evolved = AvroCodec::reading(newer).unwrap();
    evolved.learn(7, schema).unwrap();
    assert_eq!(
        m.decode::<Value>(&evolved).unwrap(),
        json!({"orderId": "o-1", "totalCents": 4250, "tenant": "acme", "channel": "web"})
    );
    // Not the schema's shape.
    assert!(Message::encode(&fixed, &json!({"orderId": 1})).is_err());
    assert!(AvroCodec::new("{not a schema").is_err());
    assert!(!fixed.accepts(None) && !fixed.accepts(Some("application/vnd.acemq.avro")));
    assert!(
        fixed.accepts(Some("application/avro"))
            && reading.accepts(Some("application/vnd.acemq.avro"))
    );
}

/// On the broker: a foreign client publishes YAML; a consumer whose codec is a composite reads
/// it by its content type through `Message::payload`.
#[cfg(feature = "yaml")]
#[test]
fn a_consumer_reads_a_foreign_yaml_message_by_its_content_type() {
    use acemq_amqp::codecs::yaml::YamlCodec;
    use acemq_amqp::{ConsumerOptions, Outcome, QueueSpec};
    use support::eventually;
    use support::raw::Raw;
    let (conn, _clean, q) = support::declared_consumed_queue_with("codec-yaml", QueueSpec::classic);
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new().codec(CompositeCodec::new(JsonCodec).or(YamlCodec)),
        )
        .unwrap()
        .start(move |m: &Message| {
            g.lock().unwrap().push(m.payload::<Value>()?);
            Ok(Outcome::Accept)
        })
        .unwrap();
    let yaml = samples("samples", "expected")
        .into_iter()
        .find(|s| s.format == "yaml")
        .unwrap();
    let raw = Raw::open();
    raw.publish(
        "",
        &q,
        &yaml.body,
        amiquip::AmqpProperties::default().with_content_type(yaml.content_type.clone()),
    );
    raw.publish(
        "",
        &q,
        br#"{"json": true}"#,
        amiquip::AmqpProperties::default(),
    );
    assert!(eventually(std::time::Duration::from_secs(30), || got
        .lock()
        .unwrap()
        .len()
        == 2));
    raw.close();
    consumer.close().unwrap();
    let got = got.lock().unwrap();
    assert_eq!(got[0], yaml.expected);
    assert_eq!(got[1], json!({"json": true}));
}

/// `codecs::by_name`: every name of the family in any case, `text` and `string` one codec, an
/// unknown name refused listing the names, `avro` / `protobuf` refused for their schema.
#[test]
fn a_codec_is_found_by_its_name_in_any_case() {
    use acemq_amqp::codecs::{self, TEXT_CONTENT_TYPE};
    use acemq_amqp::Error;
    for (name, content_type) in [
        ("json", "application/json"),
        ("JSON", "application/json"),
        ("bytes", "application/octet-stream"),
        ("Bytes", "application/octet-stream"),
        ("text", TEXT_CONTENT_TYPE),
        ("string", TEXT_CONTENT_TYPE),
        ("String", TEXT_CONTENT_TYPE),
    ] {
        assert_eq!(
            codecs::by_name(name).unwrap().content_type(),
            content_type,
            "{name}"
        );
    }
    // What a codec by name writes, the same codec made in code reads.
    let text = codecs::by_name("string").unwrap();
    let m = Message::encode(text.as_ref(), &"hello").unwrap();
    assert_eq!(m.decode::<String>(&TextCodec).unwrap(), "hello");
    let names = codecs::names();
    for name in ["json", "bytes", "text", "string"] {
        assert!(names.contains(&name), "{names:?}");
    }
    assert_eq!(names.contains(&"yaml"), cfg!(feature = "yaml"), "{names:?}");

    let unknown = codecs::by_name("cbor").unwrap_err();
    let text = unknown.to_string();
    assert!(
        matches!(unknown, Error::InvalidArgument { .. }),
        "{unknown:?}"
    );
    for listed in [
        "\"cbor\"",
        "`json`",
        "`bytes`",
        "`text` (or `string`)",
        "any case",
    ] {
        assert!(text.contains(listed), "{listed} not in {text}");
    }
    for name in ["avro", "protobuf", "Avro"] {
        let e = codecs::by_name(name).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        assert!(e.to_string().contains("not chosen by name"), "{e}");
        assert!(e.to_string().contains("a name cannot carry"), "{e}");
    }
    assert!(codecs::by_name(" json").is_err(), "a name is not trimmed");
}

/// The optional formats by name: made with their feature, refused naming it without.
#[test]
fn the_optional_formats_by_name_follow_their_features() {
    use acemq_amqp::codecs;
    for (name, feature, content_type) in [
        ("yaml", cfg!(feature = "yaml"), "application/yaml"),
        ("toml", cfg!(feature = "toml"), "application/toml"),
        ("xml", cfg!(feature = "xml"), "application/xml"),
    ] {
        match codecs::by_name(&name.to_ascii_uppercase()) {
            Ok(codec) => {
                assert!(feature, "{name} made without its feature");
                assert_eq!(codec.content_type(), content_type);
            }
            Err(e) => {
                assert!(!feature, "{name}: {e}");
                assert!(e.to_string().contains(&format!("`{name}` feature")), "{e}");
            }
        }
    }
}

/// `codecs::by_content_type`: the codec each content type names, parameters and case aside.
#[test]
fn a_codec_is_found_by_a_content_type() {
    use acemq_amqp::codecs;
    for (content_type, writes) in [
        ("application/json", "application/json"),
        ("Application/JSON; charset=utf-8", "application/json"),
        ("application/vnd.orders+json", "application/json"),
        ("text/json", "application/json"),
        ("text/plain", "text/plain; charset=utf-8"),
        ("text/csv", "text/plain; charset=utf-8"),
        ("application/octet-stream", "application/octet-stream"),
    ] {
        assert_eq!(
            codecs::by_content_type(content_type)
                .unwrap()
                .content_type(),
            writes,
            "{content_type}"
        );
    }
    #[cfg(all(feature = "yaml", feature = "toml", feature = "xml"))]
    for (content_type, writes) in [
        ("application/x-yaml", "application/yaml"),
        ("text/yaml", "application/yaml"),
        ("application/toml", "application/toml"),
        ("text/xml", "application/xml"),
        ("application/atom+xml", "application/xml"),
    ] {
        assert_eq!(
            codecs::by_content_type(content_type)
                .unwrap()
                .content_type(),
            writes,
            "{content_type}"
        );
    }
    for refused in [
        "",
        "image/png",
        "application/x-protobuf",
        "avro/binary",
        "application/vnd.acemq.encrypted",
    ] {
        let e = codecs::by_content_type(refused).unwrap_err();
        assert!(
            matches!(e, acemq_amqp::Error::InvalidArgument { .. }),
            "{refused}: {e:?}"
        );
    }
}

/// `ACEMQ_FORMAT` through `codecs::by_name`: `Settings::codec` gives the codec, the connection
/// options carry it, and a refusal names the variable and the names.
#[test]
fn settings_give_the_codec_acemq_format_names() {
    use acemq_amqp::settings::Settings;
    let s = Settings::from_vars([("ACEMQ_FORMAT", "String")]).unwrap();
    assert_eq!(s.format, "text");
    assert_eq!(
        s.codec().unwrap().content_type(),
        "text/plain; charset=utf-8"
    );
    let options = format!("{:?}", s.connection_options().unwrap());
    assert!(options.contains("TextCodec"), "{options}");
    assert_eq!(
        Settings::default().codec().unwrap().content_type(),
        "application/json"
    );
    let e = Settings::from_vars([("ACEMQ_FORMAT", "cbor")]).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("ACEMQ_FORMAT") && text.contains("`json`"),
        "{text}"
    );
    // A field changed after loading is checked when the codec is made.
    let mut s = Settings::default();
    s.format = "msgpack".into();
    assert!(s.codec().is_err());
    assert!(s.connection_options().is_err());
}

/// A connection given `codecs::by_name`'s codec publishes and reads with it on the broker.
#[test]
fn a_connection_uses_the_codec_found_by_name() {
    use acemq_amqp::codecs;
    let conn = support::connect_with(
        acemq_amqp::ConnectionOptions::new()
            .address(support::amqp_url())
            .codec(codecs::by_name("text").unwrap()),
    );
    let mut clean = support::Cleanup::new(&conn);
    let q = clean.queue(&support::unique("codec-by-name"));
    conn.declare_queue(&acemq_amqp::QueueSpec::new(&q)).unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish_value("", &q, "plain words").unwrap();
    let got = conn.get(&q).unwrap().expect("the message");
    assert_eq!(
        got.content_type.as_deref(),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(got.body, b"plain words");
    assert_eq!(
        got.decode::<String>(conn.codec().as_ref()).unwrap(),
        "plain words"
    );
}
