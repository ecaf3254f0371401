//! Codecs by name and by content type: what configuration (`ACEMQ_FORMAT`, a file's `format`)
//! or a message's content type names, turned into the codec (see the [module docs](super)).

use std::sync::Arc;

use crate::codec::{media_type, BytesCodec, Codec, JsonCodec};
use crate::error::{Error, Result};

use super::TextCodec;

/// A name [`by_name`] knows: its canonical form, the other names it answers to, and the
/// feature that builds it (`None`: always built).
struct Name {
    name: &'static str,
    aliases: &'static [&'static str],
    feature: Option<&'static str>,
    built: bool,
    /// Needs more than a name to be made (a schema, a key): refused, saying so.
    needs: Option<&'static str>,
}

/// Every name, in the order they are listed.
const NAMES: &[Name] = &[
    Name {
        name: "json",
        aliases: &[],
        feature: None,
        built: true,
        needs: None,
    },
    Name {
        name: "bytes",
        aliases: &[],
        feature: None,
        built: true,
        needs: None,
    },
    Name {
        name: "text",
        aliases: &["string"],
        feature: None,
        built: true,
        needs: None,
    },
    Name {
        name: "yaml",
        aliases: &[],
        feature: Some("yaml"),
        built: cfg!(feature = "yaml"),
        needs: None,
    },
    Name {
        name: "toml",
        aliases: &[],
        feature: Some("toml"),
        built: cfg!(feature = "toml"),
        needs: None,
    },
    Name {
        name: "xml",
        aliases: &[],
        feature: Some("xml"),
        built: cfg!(feature = "xml"),
        needs: None,
    },
    Name {
        name: "avro",
        aliases: &[],
        feature: Some("avro"),
        built: cfg!(feature = "avro"),
        needs: Some("a schema (`codecs::avro::AvroCodec`)"),
    },
    Name {
        name: "protobuf",
        aliases: &[],
        feature: Some("protobuf"),
        built: cfg!(feature = "protobuf"),
        needs: Some("a message descriptor (`codecs::protobuf::ProtobufCodec`)"),
    },
];

/// The names [`by_name`] makes a codec for in this build, canonical names first then their
/// aliases: `json`, `bytes`, `text`, `string`, and `yaml`, `toml`, `xml` with their features.
pub fn names() -> Vec<&'static str> {
    let made = || NAMES.iter().filter(|n| n.built && n.needs.is_none());
    made()
        .map(|n| n.name)
        .chain(made().flat_map(|n| n.aliases.iter().copied()))
        .collect()
}

/// The canonical name `name` stands for (`String` → `text`, `JSON` → `json`), or why none.
pub(crate) fn canonical_name(name: &str) -> Result<&'static str> {
    let known = NAMES.iter().find(|n| {
        n.name.eq_ignore_ascii_case(name) || n.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    });
    let Some(known) = known else {
        return Err(Error::invalid(format!(
            "no codec is named {name:?}: {}",
            accepted()
        )));
    };
    if let Some(needs) = known.needs {
        return Err(Error::invalid(format!(
            "the `{}` codec is not chosen by name: it needs {needs}, which a name cannot carry; \
             make it in code and give it to ConnectionOptions::codec or PublisherOptions::codec{}",
            known.name,
            feature_note(known)
        )));
    }
    if !known.built {
        return Err(Error::invalid(format!(
            "the `{}` codec needs acemq-amqp's `{}` feature, which this build does not have",
            known.name,
            known.feature.unwrap_or_default()
        )));
    }
    Ok(known.name)
}

fn feature_note(n: &Name) -> String {
    match (n.built, n.feature) {
        (false, Some(f)) => format!(" (with acemq-amqp's `{f}` feature, not in this build)"),
        _ => String::new(),
    }
}

/// What [`by_name`] accepts, said in an error.
fn accepted() -> String {
    let quoted = |n: &Name| {
        let aliases: Vec<String> = n.aliases.iter().map(|a| format!("`{a}`")).collect();
        if aliases.is_empty() {
            format!("`{}`", n.name)
        } else {
            format!("`{}` (or {})", n.name, aliases.join(", "))
        }
    };
    let built: Vec<String> = NAMES
        .iter()
        .filter(|n| n.built && n.needs.is_none())
        .map(quoted)
        .collect();
    let mut text = format!("the names are {} (in any case)", built.join(", "));
    let unbuilt: Vec<String> = NAMES
        .iter()
        .filter(|n| !n.built && n.needs.is_none())
        .map(|n| format!("`{}` (feature `{}`)", n.name, n.feature.unwrap_or_default()))
        .collect();
    if !unbuilt.is_empty() {
        text.push_str(&format!("; not in this build: {}", unbuilt.join(", ")));
    }
    text.push_str("; `avro` and `protobuf` need a schema and are made in code");
    text
}

/// The codec a name chosen in configuration stands for: `json`, `bytes`, `text` (or
/// `string`), and with their features `yaml`, `toml`, `xml` — in any case (`JSON`, `Text`).
///
/// Case does not matter because the name comes from configuration written by people and by
/// other tools (`ACEMQ_FORMAT=JSON`), as Java's `Codecs.byName` and .NET's `CodecRegistry`
/// read it; no two codecs differ only in case, and every name Python's `codec_by_name` and
/// Ruby's `Codecs.build` accept (lower case, case-sensitive there) is accepted here. Both
/// `text` (Python's and Java's name) and `string` (Go's, Ruby's and .NET's) name
/// [`TextCodec`], so one `ACEMQ_FORMAT` serves a deployment of the family whichever name it
/// was written with. Each call makes a new codec.
///
/// ```
/// use acemq_amqp::codecs;
///
/// # fn main() -> acemq_amqp::Result<()> {
/// assert_eq!(codecs::by_name("json")?.content_type(), "application/json");
/// assert_eq!(codecs::by_name("String")?.content_type(), "text/plain; charset=utf-8");
/// let e = codecs::by_name("cbor").unwrap_err();
/// assert!(e.to_string().contains("`json`"), "{e}");
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::InvalidArgument`]: for an unknown name, listing the names accepted (and those
/// behind a feature this build lacks); for `yaml`, `toml` or `xml` without its feature, naming
/// the feature; for `avro` and `protobuf`, which need a schema a name cannot carry (make them
/// in code: [`ConnectionOptions::codec`](crate::ConnectionOptions::codec)).
pub fn by_name(name: &str) -> Result<Arc<dyn Codec>> {
    Ok(match canonical_name(name)? {
        "json" => Arc::new(JsonCodec),
        "bytes" => Arc::new(BytesCodec),
        #[cfg(feature = "yaml")]
        "yaml" => Arc::new(super::yaml::YamlCodec),
        #[cfg(feature = "toml")]
        "toml" => Arc::new(super::toml::TomlCodec),
        #[cfg(feature = "xml")]
        "xml" => Arc::new(super::xml::XmlCodec::default()),
        // "text"; the others are refused by `canonical_name` in a build without them.
        _ => Arc::new(TextCodec),
    })
}

/// The codec that reads and writes `content_type` (its parameters, such as `; charset=utf-8`,
/// and its case do not matter), as each codec [accepts](Codec::accepts) it: JSON for
/// `application/json`, `text/json` and `*+json`; YAML, TOML and XML for theirs (with their
/// features); [`TextCodec`] for any other `text/*`; [`BytesCodec`] for
/// `application/octet-stream`.
///
/// ```
/// use acemq_amqp::codecs;
///
/// # fn main() -> acemq_amqp::Result<()> {
/// let codec = codecs::by_content_type("application/vnd.orders+json; charset=utf-8")?;
/// assert_eq!(codec.content_type(), "application/json");
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::InvalidArgument`] for an empty or unknown content type, for one whose codec needs
/// a feature this build lacks, and for Avro, protobuf and encrypted content, whose codecs need
/// a schema or a key.
pub fn by_content_type(content_type: &str) -> Result<Arc<dyn Codec>> {
    let media = media_type(content_type);
    if media.is_empty() {
        return Err(Error::invalid("no content type to choose a codec by"));
    }
    let ct = Some(content_type);
    if JsonCodec.accepts(ct) {
        return by_name("json");
    }
    let listed = |prefixes: &[&str], suffix: &str| {
        prefixes.iter().any(|p| media.starts_with(p)) || media.contains(suffix)
    };
    let by_feature: [(&str, bool); 5] = [
        (
            "yaml",
            listed(
                &[
                    "application/yaml",
                    "application/x-yaml",
                    "text/yaml",
                    "text/x-yaml",
                ],
                "+yaml",
            ),
        ),
        ("toml", listed(&["application/toml", "text/toml"], "+toml")),
        ("xml", listed(&["application/xml", "text/xml"], "+xml")),
        (
            "protobuf",
            listed(
                &[
                    "application/x-protobuf",
                    "application/protobuf",
                    "application/vnd.google.protobuf",
                ],
                "+protobuf",
            ),
        ),
        (
            "avro",
            listed(
                &[
                    "avro/binary",
                    "application/vnd.acemq.avro",
                    "application/avro",
                ],
                "+avro",
            ),
        ),
    ];
    if let Some((name, _)) = by_feature.iter().find(|(_, hit)| *hit) {
        return by_name(name);
    }
    if media.starts_with("application/vnd.acemq.encrypted") {
        return Err(Error::invalid(format!(
            "{content_type:?} is encrypted: its codec needs a key, which a content type cannot \
             carry (`codecs::encrypted::EncryptedCodec`, feature `encryption`)"
        )));
    }
    if TextCodec.accepts(ct) {
        return by_name("text");
    }
    if media == "application/octet-stream" {
        return by_name("bytes");
    }
    Err(Error::invalid(format!(
        "no codec reads {content_type:?}: JSON (`application/json`, `*+json`), text (`text/*`), \
         bytes (`application/octet-stream`), YAML, TOML and XML (with their features)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_canonical_name_and_alias_is_found_in_any_case() {
        for name in names() {
            assert!(by_name(name).is_ok(), "{name}");
            assert!(by_name(&name.to_ascii_uppercase()).is_ok(), "{name}");
        }
        assert_eq!(canonical_name("STRING").unwrap(), "text");
        assert_eq!(canonical_name("Text").unwrap(), "text");
    }
}
