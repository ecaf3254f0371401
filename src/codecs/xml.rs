//! XML (`application/xml`), through `quick-xml`.
//!
//! **Writing**: an object becomes one root element named [`XmlCodec::root`] (default
//! `message`; give the type's name, e.g. `OrderPlaced`, to write what Jackson and Go's
//! `encoding/xml` write for a record), each key a child element, an array a repeated element,
//! a boolean `true`/`false`, null an empty element, no XML declaration, no indentation.
//! Anything but an object at the top is refused (an XML document has one root with named
//! children).
//!
//! **Reading**: an element with children or attributes becomes an object (attributes and
//! children by local name — namespaces dropped; a repeated child becomes an array), any other
//! element its text (XML has no types: `<n>4250</n>` reads as the string `"4250"`, as Jackson
//! reads XML into a map). **Every document with a DTD (`<!DOCTYPE`) is refused**, and entity
//! references other than the five predefined ones and character references are refused: a
//! message body has no use for them and they are how an XML parser is turned against its
//! host (Python `codecs/xml.py`, Java alike; not configurable).
//!
//! Reads `application/xml`, `text/xml` and `*+xml`, never a message with no content type.

use quick_xml::events::Event;
use quick_xml::Reader;
use serde_json::{Map, Value};

use super::{accepts_listed, fatal, kind_of};
use crate::codec::Codec;
use crate::error::{BoxError, Error, Result};

/// What [`XmlCodec`] writes.
pub const XML_CONTENT_TYPE: &str = "application/xml";
/// The root element name written when none is given.
pub const DEFAULT_ROOT: &str = "message";

/// XML through `quick-xml` (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct XmlCodec {
    root: String,
}

impl Default for XmlCodec {
    fn default() -> Self {
        XmlCodec {
            root: DEFAULT_ROOT.into(),
        }
    }
}

impl XmlCodec {
    /// Writes objects as `<root>…</root>`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `root` is not an XML name.
    pub fn new(root: impl Into<String>) -> Result<XmlCodec> {
        let root = root.into();
        if !is_name(&root) {
            return Err(Error::invalid(format!(
                "{root:?} is not an XML element name"
            )));
        }
        Ok(XmlCodec { root })
    }

    /// The root element name written.
    pub fn root(&self) -> &str {
        &self.root
    }
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.to_ascii_lowercase().starts_with("xml")
}

fn write_value(out: &mut String, name: &str, value: &Value) -> std::result::Result<(), BoxError> {
    if let Value::Array(items) = value {
        for item in items {
            write_value(out, name, item)?;
        }
        return Ok(());
    }
    if !is_name(name) {
        return Err(format!("acemq: {name:?} cannot be an XML element name").into());
    }
    out.push('<');
    out.push_str(name);
    out.push('>');
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                write_value(out, k, v)?;
            }
        }
        Value::Null => {}
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => out.push_str(&quick_xml::escape::escape(s.as_str())),
        // Written as repeated elements above, before an element is opened.
        Value::Array(_) => {}
    }
    out.push_str("</");
    out.push_str(name);
    out.push('>');
    Ok(())
}

/// One element being read: its fields so far, and its text.
#[derive(Default)]
struct Open {
    name: String,
    fields: Map<String, Value>,
    text: String,
}

fn local(name: &str) -> String {
    name.rsplit(':').next().unwrap_or(name).to_string()
}

fn add_field(fields: &mut Map<String, Value>, name: String, value: Value) {
    match fields.get_mut(&name) {
        None => {
            fields.insert(name, value);
        }
        Some(Value::Array(items)) => items.push(value),
        Some(existing) => {
            let first = existing.take();
            *existing = Value::Array(vec![first, value]);
        }
    }
}

fn finish(open: Open) -> Value {
    if open.fields.is_empty() {
        Value::String(open.text)
    } else {
        Value::Object(open.fields)
    }
}

const DTD_REFUSED: &str = "acemq: this message carries a document type declaration. A message \
     body has no use for one, and a parser that reads DTDs expands entities on behalf of whoever \
     sent the message. This codec refuses every DTD and the refusal is not configurable";

fn start(e: &quick_xml::events::BytesStart<'_>) -> std::result::Result<Open, BoxError> {
    let mut open = Open {
        name: local(e.name().as_ref()),
        ..Open::default()
    };
    for attr in e.attributes() {
        let attr = attr.map_err(|e| not_xml(&e))?;
        let key = local(attr.key.as_ref());
        if attr.key.as_ref() == "xmlns" || attr.key.as_ref().starts_with("xmlns:") {
            continue;
        }
        let value = attr
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| not_xml(&e))?;
        add_field(&mut open.fields, key, Value::String(value.into_owned()));
    }
    Ok(open)
}

fn not_xml(e: &dyn std::fmt::Display) -> BoxError {
    fatal(format!("acemq: this message is not XML: {e}"))
}

fn parse(body: &[u8]) -> std::result::Result<Value, BoxError> {
    let text = std::str::from_utf8(body).map_err(|e| not_xml(&e))?;
    let mut reader = Reader::from_str(text);
    let mut stack: Vec<Open> = Vec::new();
    let mut root: Option<Value> = None;
    loop {
        let event = reader.read_event().map_err(|e| not_xml(&e))?;
        match event {
            Event::DocType(_) => return Err(fatal(DTD_REFUSED)),
            Event::Start(e) => {
                if root.is_some() {
                    return Err(not_xml(&"more than one root element"));
                }
                stack.push(start(&e)?);
            }
            Event::Empty(e) => {
                let open = start(&e)?;
                let name = open.name.clone();
                let value = finish(open);
                match stack.last_mut() {
                    Some(parent) => add_field(&mut parent.fields, name, value),
                    None if root.is_none() => root = Some(value),
                    None => return Err(not_xml(&"more than one root element")),
                }
            }
            Event::End(_) => {
                let open = stack
                    .pop()
                    .ok_or_else(|| not_xml(&"an end tag with no start"))?;
                let name = open.name.clone();
                let value = finish(open);
                match stack.last_mut() {
                    Some(parent) => add_field(&mut parent.fields, name, value),
                    None => root = Some(value),
                }
            }
            Event::Text(t) => {
                if let Some(open) = stack.last_mut() {
                    open.text.push_str(&t.xml10_content());
                } else if !t.xml10_content().trim().is_empty() {
                    return Err(not_xml(&"text outside the root element"));
                }
            }
            Event::CData(c) => {
                if let Some(open) = stack.last_mut() {
                    open.text.push_str(c.into_inner().as_ref());
                }
            }
            Event::GeneralRef(r) => {
                let resolved = match r.resolve_char_ref().map_err(|e| not_xml(&e))? {
                    Some(c) => c,
                    None => match r.xml10_content().as_ref() {
                        "lt" => '<',
                        "gt" => '>',
                        "amp" => '&',
                        "apos" => '\'',
                        "quot" => '"',
                        other => {
                            return Err(fatal(format!(
                                "acemq: this message refers to the entity &{other}; which is not \
                                 one of XML's five: this codec expands no other entity"
                            )))
                        }
                    },
                };
                if let Some(open) = stack.last_mut() {
                    open.text.push(resolved);
                }
            }
            Event::Eof => break,
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
        }
    }
    if !stack.is_empty() {
        return Err(not_xml(&"the document ends inside an element"));
    }
    root.ok_or_else(|| not_xml(&"no root element"))
}

impl Codec for XmlCodec {
    fn content_type(&self) -> &str {
        XML_CONTENT_TYPE
    }
    fn encode(&self, value: &Value) -> std::result::Result<Vec<u8>, BoxError> {
        if !value.is_object() {
            return Err(format!(
                "acemq: cannot encode {} as XML: a document has one root element with named \
                 children, so the top level has to be an object",
                kind_of(value)
            )
            .into());
        }
        let mut out = String::new();
        write_value(&mut out, &self.root, value)?;
        Ok(out.into_bytes())
    }
    fn decode(&self, body: &[u8]) -> std::result::Result<Value, BoxError> {
        parse(body)
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        accepts_listed(content_type, &["application/xml", "text/xml"], "+xml")
    }
}
