//! The client's profile file: where the server is and which key to call it with, so that
//! neither has to be typed or exported for every command.
//!
//! The file is `$XDG_CONFIG_HOME/orl/config.toml`, or `~/.config/orl/config.toml` when
//! `XDG_CONFIG_HOME` is unset. Its top-level `url` and `key` (or `key_file`) are the
//! default profile; a `[profiles.NAME]` table is a named one, chosen with `--profile NAME`
//! or `ORL_PROFILE`, whose missing settings fall back to the top level's. A flag beats the
//! environment, which beats the profile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use serde::Deserialize;

/// Where the client talks to when nothing names a server.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// One profile's settings, each optional.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    url: Option<String>,
    key: Option<String>,
    key_file: Option<PathBuf>,
}

/// The whole file: the default profile's settings and the named profiles.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(flatten)]
    default: Settings,
    #[serde(default)]
    profiles: BTreeMap<String, Settings>,
}

/// What the profile file says for one profile, its key already read from `key_file`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Profile {
    pub url: Option<String>,
    pub key: Option<String>,
}

/// The profile file's path: under `XDG_CONFIG_HOME` when it is set to an absolute path,
/// under `~/.config` otherwise; `None` without either.
pub fn path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .or_else(|| std::env::home_dir().map(|home| home.join(".config")))?;
    Some(base.join("orl").join("config.toml"))
}

/// The settings of profile `name` (the top level's when `None`) from the file at `path`.
/// A missing file is an empty profile, unless a profile was named.
pub fn load(path: Option<&Path>, name: Option<&str>) -> anyhow::Result<Profile> {
    let Some(path) = path else {
        return match name {
            Some(name) => Err(anyhow!(
                "profile {name:?}: no profile file (set HOME or XDG_CONFIG_HOME)"
            )),
            None => Ok(Profile::default()),
        };
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound && name.is_none() => {
            return Ok(Profile::default());
        }
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    let file: File = toml::from_str(&text).with_context(|| format!("in {}", path.display()))?;
    let settings = match name {
        None => file.default,
        Some(name) => {
            let named = file
                .profiles
                .get(name)
                .with_context(|| format!("{} has no [profiles.{name}] table", path.display()))?;
            merge(named, &file.default)
        }
    };
    resolve(settings, path).with_context(|| format!("in {}", path.display()))
}

/// `named`'s settings, each missing one taken from `default`; a key given either way in
/// `named` wins over both of `default`'s.
fn merge(named: &Settings, default: &Settings) -> Settings {
    let own_key = named.key.is_some() || named.key_file.is_some();
    Settings {
        url: named.url.clone().or_else(|| default.url.clone()),
        key: if own_key {
            named.key.clone()
        } else {
            default.key.clone()
        },
        key_file: if own_key {
            named.key_file.clone()
        } else {
            default.key_file.clone()
        },
    }
}

/// Reads the key file, if the settings name one (relative to the profile file's folder;
/// `~/` is the home directory).
fn resolve(settings: Settings, config: &Path) -> anyhow::Result<Profile> {
    let key = match (settings.key, settings.key_file) {
        (Some(_), Some(_)) => bail!("give key or key_file, not both"),
        (Some(key), None) => Some(key),
        (None, Some(file)) => {
            let file = expand(&file, config);
            let key = std::fs::read_to_string(&file)
                .with_context(|| format!("reading key_file {}", file.display()))?;
            Some(key.trim().to_string())
        }
        (None, None) => None,
    };
    Ok(Profile {
        url: settings.url,
        key,
    })
}

fn expand(file: &Path, config: &Path) -> PathBuf {
    if let (Ok(rest), Some(home)) = (file.strip_prefix("~"), std::env::home_dir()) {
        return home.join(rest);
    }
    match config.parent() {
        Some(dir) if file.is_relative() => dir.join(file),
        _ => file.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_named_profile_falls_back_to_the_top_level_settings() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "admin.key", "or_admin\n");
        let config = write(
            dir.path(),
            "config.toml",
            r#"
url = "http://orl.example:8080"
key_file = "admin.key"

[profiles.tenant]
key = "or_tenant"

[profiles.staging]
url = "http://staging:8080"
"#,
        );
        let top = load(Some(&config), None).unwrap();
        assert_eq!(top.url.as_deref(), Some("http://orl.example:8080"));
        assert_eq!(top.key.as_deref(), Some("or_admin"), "read and trimmed");
        let tenant = load(Some(&config), Some("tenant")).unwrap();
        assert_eq!(tenant.url.as_deref(), Some("http://orl.example:8080"));
        assert_eq!(tenant.key.as_deref(), Some("or_tenant"));
        let staging = load(Some(&config), Some("staging")).unwrap();
        assert_eq!(staging.url.as_deref(), Some("http://staging:8080"));
        assert_eq!(staging.key.as_deref(), Some("or_admin"));
        let err = load(Some(&config), Some("prod")).unwrap_err();
        assert!(
            format!("{err:#}").contains("no [profiles.prod] table"),
            "{err:#}"
        );
    }

    #[test]
    fn a_missing_file_is_an_empty_profile_unless_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("config.toml");
        assert_eq!(load(Some(&missing), None).unwrap(), Profile::default());
        assert!(load(Some(&missing), Some("tenant")).is_err());
    }

    #[test]
    fn unknown_settings_and_two_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let typo = write(dir.path(), "typo.toml", "ulr = \"http://x\"\n");
        let err = load(Some(&typo), None).unwrap_err();
        assert!(format!("{err:#}").contains("ulr"), "{err:#}");
        let both = write(
            dir.path(),
            "both.toml",
            "key = \"or_a\"\nkey_file = \"k\"\n",
        );
        let err = load(Some(&both), None).unwrap_err();
        assert!(format!("{err:#}").contains("not both"), "{err:#}");
    }
}
