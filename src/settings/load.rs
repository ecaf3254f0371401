//! Reading the settings: the variables (the process's or given), the TOML file (feature
//! `toml`), and the order they are applied in.

use std::path::{Path, PathBuf};

use super::keys::{self, env_name, Unknown, KEYS};
use super::parse::refuse;
use super::Settings;
use crate::error::{Error, Result};

/// The variable naming the settings file.
const CONFIG_FILE: &str = "ACEMQ_CONFIG_FILE";

/// Values found for known keys, applied in the table's order (so of two names for one field
/// the later in the table wins; of one name given twice, the later given). Each is
/// `(key, label, value)`; an empty value counts as not set.
type Found = Vec<(usize, String, String)>;

fn apply(settings: &mut Settings, mut found: Found) -> Result<()> {
    found.sort_by_key(|(key, _, _)| *key);
    for (key, label, value) in found {
        if !value.is_empty() {
            (KEYS[key].set)(settings, &label, &value)?;
        }
    }
    Ok(())
}

/// The process's `ACEMQ_*` variables; a setting whose value is not UTF-8 is refused by name
/// (its value not shown).
fn process_vars() -> Result<Vec<(String, String)>> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str().filter(|n| n.starts_with("ACEMQ_")) else {
            continue;
        };
        let value = match value.into_string() {
            Ok(value) => value,
            Err(_) if keys::by_env_name(name).is_some() => {
                return Err(refuse(name, "the value is not UTF-8"));
            }
            // Not a setting: warned about (or skipped) by name like any other.
            Err(raw) => raw.to_string_lossy().into_owned(),
        };
        vars.push((name.to_string(), value));
    }
    Ok(vars)
}

fn owned<I, K, V>(vars: I) -> Vec<(String, String)>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    vars.into_iter()
        .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()))
        .collect()
}

impl Settings {
    /// The settings of the process's `ACEMQ_*` variables over the defaults (no file).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the first variable whose value is refused, or the
    /// settings that do not go together.
    pub fn from_env() -> Result<Settings> {
        Settings::from_vars(process_vars()?)
    }

    /// The settings of `vars` — pairs of a variable's name and value, as
    /// [`std::env::vars`] gives them — over the defaults, the process's environment not read.
    /// Names not starting with `ACEMQ_` are skipped; unknown `ACEMQ_` names are logged at warn.
    ///
    /// ```
    /// use acemq_amqp::settings::Settings;
    /// # fn main() -> acemq_amqp::Result<()> {
    /// let settings = Settings::from_vars([
    ///     ("ACEMQ_URL", "amqp://rabbit.internal/"),
    ///     ("ACEMQ_CONSUMER__PREFETCH", "64"),
    ///     ("ACEMQ_CONSUMER__SHUTDOWN_TIMEOUT", "PT45S"),
    /// ])?;
    /// assert_eq!(settings.consumer.prefetch, 64);
    /// assert_eq!(settings.drain_timeout(), std::time::Duration::from_secs(45));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_vars<I, K, V>(vars: I) -> Result<Settings>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut settings = Settings::default();
        settings.apply_vars(owned(vars))?;
        settings.check()?;
        Ok(settings)
    }

    /// The settings as a service reads them: the defaults, then the TOML file — `file`, or the
    /// one `ACEMQ_CONFIG_FILE` names, which wins over `file` —, then the process's `ACEMQ_*`
    /// variables, each later one overriding the earlier.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env), with the file's keys named as the file's; a file that
    /// cannot be read is [`Error::Io`] naming it; a file without the `toml` feature is
    /// [`Error::InvalidArgument`].
    pub fn load(file: Option<&Path>) -> Result<Settings> {
        Settings::load_with(file, process_vars()?)
    }

    /// [`load`](Self::load) with the variables given (as [`from_vars`](Self::from_vars)) in
    /// place of the process's, `ACEMQ_CONFIG_FILE` among them.
    ///
    /// # Errors
    ///
    /// As [`load`](Self::load).
    pub fn load_with<I, K, V>(file: Option<&Path>, vars: I) -> Result<Settings>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let vars = owned(vars);
        let named = vars
            .iter()
            .rev()
            .find(|(name, value)| name == CONFIG_FILE && !value.is_empty())
            .map(|(_, value)| PathBuf::from(value));
        let mut settings = Settings::default();
        match (named.as_deref(), file) {
            (Some(path), _) => settings.apply_file(path, Some(CONFIG_FILE))?,
            (None, Some(path)) => settings.apply_file(path, None)?,
            (None, None) => {}
        }
        settings.apply_vars(vars)?;
        settings.check()?;
        Ok(settings)
    }

    fn apply_vars(&mut self, vars: Vec<(String, String)>) -> Result<()> {
        let mut found = Found::new();
        for (name, value) in vars {
            if !name.starts_with("ACEMQ_") || keys::is_someone_elses(&name) {
                continue;
            }
            match keys::by_env_name(&name) {
                Some(key) => found.push((key, name, value)),
                None => match keys::unknown(&name) {
                    Unknown::NotRead(why) => {
                        log::warn!("{name} is not read by acemq-amqp: {why}; it is ignored")
                    }
                    Unknown::Near(key) => log::warn!(
                        "{name} is not a setting of acemq-amqp (did you mean {}?); it is ignored",
                        env_name(KEYS[key].path)
                    ),
                    Unknown::Nothing => {
                        log::warn!("{name} is not a setting of acemq-amqp; it is ignored")
                    }
                },
            }
        }
        apply(self, found)
    }

    #[cfg(not(feature = "toml"))]
    fn apply_file(&mut self, path: &Path, named_by: Option<&str>) -> Result<()> {
        let by = named_by.map(|n| format!(" ({n})")).unwrap_or_default();
        Err(Error::invalid(format!(
            "the settings file {}{by}: reading it needs acemq-amqp's `toml` feature",
            path.display()
        )))
    }

    #[cfg(feature = "toml")]
    fn apply_file(&mut self, path: &Path, named_by: Option<&str>) -> Result<()> {
        let by = named_by.map(|n| format!(" ({n})")).unwrap_or_default();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            context: format!("reading the settings file {}{by}", path.display()),
            source,
        })?;
        self.apply_toml(&text, &format!("in {}", path.display()))
    }

    /// The settings of a TOML text over the defaults: the keys nested as the variables are
    /// (`url`; `prefetch` under `[consumer]`; `kind` under `[consumer.retry]`; `[tls]`,
    /// `[actuator]`). A duration is a number of seconds or a string in any form a variable
    /// takes; unknown keys are logged at warn. Feature `toml`.
    ///
    /// ```
    /// use acemq_amqp::settings::Settings;
    /// # fn main() -> acemq_amqp::Result<()> {
    /// let settings = Settings::from_toml_str(
    ///     r#"
    ///     url = "amqp://rabbit.internal/"
    ///     [consumer.retry]
    ///     enabled = true
    ///     max_attempts = 5
    ///     initial_delay = "2s"
    ///     "#,
    /// )?;
    /// assert_eq!(settings.retry_policy().unwrap().attempts(), 5);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for text that is not TOML (its line and column, never the
    /// line itself, which may hold a password), or a value refused, naming its key.
    #[cfg(feature = "toml")]
    #[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
    pub fn from_toml_str(text: &str) -> Result<Settings> {
        let mut settings = Settings::default();
        settings.apply_toml(text, "in the TOML settings")?;
        settings.check()?;
        Ok(settings)
    }

    /// [`from_toml_str`](Self::from_toml_str) of the file at `path` (no variables read: see
    /// [`load`](Self::load)). Feature `toml`.
    ///
    /// # Errors
    ///
    /// As [`from_toml_str`](Self::from_toml_str); a file that cannot be read is [`Error::Io`]
    /// naming it.
    #[cfg(feature = "toml")]
    #[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Settings> {
        let mut settings = Settings::default();
        settings.apply_file(path.as_ref(), None)?;
        settings.check()?;
        Ok(settings)
    }

    /// Applies a TOML text; `origin` ends each refusal's label (`in /etc/acemq.toml`).
    #[cfg(feature = "toml")]
    fn apply_toml(&mut self, text: &str, origin: &str) -> Result<()> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let at = e
                .span()
                .map(|span| {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                    format!(" at line {line}, column {column}")
                })
                .unwrap_or_default();
            Error::invalid(format!(
                "the settings {origin} are not TOML{at}: {}",
                e.message().trim_end()
            ))
        })?;
        let mut found = Found::new();
        flatten(&table, "", origin, &mut found)?;
        apply(self, found)
    }
}

/// Every leaf of `table` under `prefix` that is a setting into `found`; the rest warned about.
#[cfg(feature = "toml")]
fn flatten(table: &toml::Table, prefix: &str, origin: &str, found: &mut Found) -> Result<()> {
    use toml::Value;
    for (name, value) in table {
        let path = format!("{prefix}{name}");
        let label = format!("`{path}` {origin}");
        let key = keys::by_path(&path);
        let text = match (value, key) {
            (Value::Table(inner), None) => {
                let below = format!("{path}.");
                if KEYS.iter().any(|k| k.path.starts_with(&below)) {
                    flatten(inner, &below, origin, found)?;
                } else {
                    warn_unknown_key(&path, origin);
                }
                continue;
            }
            (_, None) => {
                let below = format!("{path}.");
                if KEYS.iter().any(|k| k.path.starts_with(&below)) {
                    return Err(refuse(
                        &label,
                        format!("one value where a table (`[{path}]`) is expected"),
                    ));
                }
                warn_unknown_key(&path, origin);
                continue;
            }
            (Value::Table(_), Some(_)) => {
                return Err(refuse(&label, "a table where one value is expected"));
            }
            (Value::Array(items), Some(_)) if path == "url" => {
                let mut urls = Vec::new();
                for item in items {
                    match item {
                        Value::String(s) => urls.push(s.as_str()),
                        _ => return Err(refuse(&label, "a list of anything but URL strings")),
                    }
                }
                urls.join(",")
            }
            (Value::Array(_), Some(_)) => {
                return Err(refuse(&label, "a list where one value is expected"));
            }
            (Value::String(s), Some(_)) => s.clone(),
            (Value::Integer(i), Some(_)) => i.to_string(),
            (Value::Float(f), Some(_)) => f.to_string(),
            (Value::Boolean(b), Some(_)) => b.to_string(),
            (Value::Datetime(d), Some(_)) => d.to_string(),
        };
        if let Some(key) = key {
            found.push((key, label, text));
        }
    }
    Ok(())
}

#[cfg(feature = "toml")]
fn warn_unknown_key(path: &str, origin: &str) {
    match keys::unknown(&env_name(path)) {
        Unknown::NotRead(why) => {
            log::warn!("`{path}` {origin} is not read by acemq-amqp: {why}; it is ignored")
        }
        Unknown::Near(key) => log::warn!(
            "`{path}` {origin} is not a setting of acemq-amqp (did you mean `{}`?); it is ignored",
            KEYS[key].path
        ),
        Unknown::Nothing => {
            log::warn!("`{path}` {origin} is not a setting of acemq-amqp; it is ignored")
        }
    }
}
